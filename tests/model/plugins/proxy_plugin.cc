// Another build of the GPT plugin, for the hot-update tests: it loads libkeel_gpt.so from the
// running keel binary's directory and serves the same table (so it fits the same state and computes
// the same bits), as a different file with a different hash. Built four times:
//   libkeel_gpt_proxy.so     the same model, nothing else
//   libkeel_llama_proxy.so   the same for the Llama example plugin (KEEL_PROXY_INNER): a hot
//                            update of a plugin keel knows nothing about
//   libkeel_gpt_crashing.so  raises SIGSEGV in its 4th forward call (code that breaks after
//                            a few steps: the update's probation must roll it back)
//   libkeel_gpt_renamed.so   describes its first parameter under another name (code that no
//                            longer fits the running state: the update must be refused)
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "model/plugin.h"

#ifndef KEEL_PROXY_INNER
#define KEEL_PROXY_INNER "libkeel_gpt.so"  // the plugin this build serves
#endif

namespace {

keel_plugin g_table;
const keel_plugin* g_inner = nullptr;

int forward(const keel_model_dims* d, const keel_stage* s, keel_stage_args* a) {
#ifdef KEEL_PROXY_CRASH
  static int forwards = 0;
  if (++forwards > 3) raise(SIGSEGV);
#endif
  return g_inner->forward(d, s, a);
}

int describe(const keel_model_dims* d, const keel_stage* s, keel_param_desc* out, int capacity) {
  const int n = g_inner->describe_params(d, s, out, capacity);
#ifdef KEEL_PROXY_RENAME
  if (out && capacity > 0 && n > 0) std::snprintf(out[0].name, sizeof(out[0].name), "renamed");
#endif
  return n;
}

const keel_plugin* load_inner(uint32_t abi) {
  // Next to the running keel binary: this file itself is loaded from a private copy elsewhere.
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return nullptr;
  std::string dir(exe, size_t(n));
  dir = dir.substr(0, dir.rfind('/') + 1);
  void* h = dlopen((dir + KEEL_PROXY_INNER).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return nullptr;
  auto entry = reinterpret_cast<keel_plugin_entry_fn>(dlsym(h, KEEL_PLUGIN_ENTRY_SYMBOL));
  return entry ? entry(abi) : nullptr;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const keel_plugin* keel_plugin_entry(
    uint32_t abi) {
  if (!g_inner) {
    g_inner = load_inner(abi);
    if (!g_inner) return nullptr;
    std::memcpy(&g_table, g_inner, sizeof(g_table));
    g_table.forward = &forward;
    g_table.describe_params = &describe;
  }
  return &g_table;
}
