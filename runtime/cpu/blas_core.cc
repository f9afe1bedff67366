// The OpenBLAS core decision and the re-exec that applies it (see blas_core.h).
#include "runtime/cpu/blas_core.h"
#include "runtime/logging.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

namespace keel {

namespace {

constexpr const char* kCoreVar = "OPENBLAS_CORETYPE";
constexpr const char* kMarkerVar = "KEEL_BLAS_CORE";

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

using blas_core_detail::iequal;

BlasCoreInputs this_process(const std::string& requested) {
  BlasCoreInputs in;
  in.loaded = openblas_get_corename();
  in.best = best_blas_core(cpu_features());
  in.requested = requested;
  in.env_coretype = env_or_empty(kCoreVar);
  in.env_marker = env_or_empty(kMarkerVar);
  in.dynamic_arch = std::string(openblas_get_config()).find("DYNAMIC_ARCH") != std::string::npos;
  return in;
}

BlasPath path_of(const BlasCoreInputs& in, const BlasCoreDecision& d) {
  return {openblas_get_config(), in.loaded, in.best, d.chosen_by, d.note};
}

std::mutex g_mu;
std::optional<BlasPath> g_selected;

}  // namespace

std::string best_blas_core(const CpuFeatures& cpu) {
  if (cpu.avx512() && cpu.avx512_bf16) return "Cooperlake";
  if (cpu.avx512()) return "SkylakeX";
  if (cpu.avx2 && cpu.fma) return cpu.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
  return "";
}

BlasCoreDecision decide_blas_core(const BlasCoreInputs& in) {
  BlasCoreDecision d;
  if (!iequal(in.requested, "auto") && !in.requested.empty()) {
    const std::string want(canonical_blas_core(in.requested));
    if (iequal(in.loaded, want)) {
      d.chosen_by = "runtime.blas_core";
    } else if (!in.dynamic_arch || iequal(in.env_coretype, want)) {
      // Already asked for it at load, or the library cannot switch: do not loop.
      d.chosen_by = "OpenBLAS";
      d.note =
          "runtime.blas_core = " + want + " but OpenBLAS runs " + in.loaded +
          (in.dynamic_arch ? " (it ignored OPENBLAS_CORETYPE)" : " (not a DYNAMIC_ARCH build)");
    } else {
      d.reexec_with = want;
    }
    return d;
  }
  const bool less = !in.best.empty() && blas_core_rank(in.loaded) < blas_core_rank(in.best);
  if (!in.env_coretype.empty()) {
    if (iequal(in.env_coretype, in.env_marker)) {
      d.chosen_by = "keel";
      if (!iequal(in.loaded, in.env_coretype))
        d.note =
            "keel set OPENBLAS_CORETYPE=" + in.env_coretype + " but OpenBLAS runs " + in.loaded;
    } else {
      d.chosen_by = "OPENBLAS_CORETYPE";
      if (less)
        d.note = "OPENBLAS_CORETYPE=" + in.env_coretype + " is set, so OpenBLAS runs " + in.loaded +
                 "; keel would choose " + in.best + " for this CPU";
    }
    return d;
  }
  d.chosen_by = "OpenBLAS";
  if (!less) return d;
  if (!in.dynamic_arch) {
    d.note = "OpenBLAS runs " + in.loaded + " and, built without DYNAMIC_ARCH, cannot switch to " +
             in.best + ", the best core for this CPU";
    return d;
  }
  d.reexec_with = in.best;
  return d;
}

BlasPath select_blas_core(const std::string& requested, char** argv) {
  const BlasCoreInputs in = this_process(requested);
  const BlasCoreDecision d = decide_blas_core(in);
  if (!d.reexec_with.empty()) {
    // OpenBLAS has loaded already; only a fresh image reads the variable. exec keeps the pid,
    // so a supervisor or launcher watching this process sees nothing of it.
    if (setenv(kCoreVar, d.reexec_with.c_str(), 1) == 0 &&
        setenv(kMarkerVar, d.reexec_with.c_str(), 1) == 0) {
      std::fflush(nullptr);
      execv("/proc/self/exe", argv);
    }
    // Not fatal: the job runs, slower, on the core it has.
    const int err = errno;
    unsetenv(kCoreVar);
    unsetenv(kMarkerVar);
    BlasPath p = path_of(in, {"", "OpenBLAS", ""});
    p.note = "could not re-execute with OPENBLAS_CORETYPE=" + d.reexec_with + " (" +
             std::strerror(err) + "); running on " + in.loaded;
    LOG(WARNING) << p.note;
    std::lock_guard<std::mutex> lock(g_mu);
    g_selected = p;
    return p;
  }
  BlasPath p = path_of(in, d);
  if (!p.note.empty()) LOG(INFO) << p.note;
  std::lock_guard<std::mutex> lock(g_mu);
  g_selected = p;
  return p;
}

BlasPath blas_path() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_selected) return *g_selected;
  }
  const BlasCoreInputs in = this_process("auto");
  BlasCoreDecision d = decide_blas_core(in);
  // Not selected at start (a test, a tool): say what keel would do rather than do it.
  if (!d.reexec_with.empty()) {
    d.chosen_by = "OpenBLAS";
    d.note = "keel would choose " + d.reexec_with;
  }
  return path_of(in, d);
}

void add_blas_core_env(std::map<std::string, std::string>* env) {
  if (env->count(kCoreVar) || std::getenv(kCoreVar)) return;
  const BlasCoreDecision d = decide_blas_core(this_process("auto"));
  if (d.reexec_with.empty()) return;
  (*env)[kCoreVar] = d.reexec_with;
  (*env)[kMarkerVar] = d.reexec_with;
}

}  // namespace keel
