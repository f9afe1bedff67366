// keel-golden: runs the golden mini-GPT self-check (robust/golden_check.h) in this process.
//   keel-golden [--device cpu|cuda] [--precision fp32|bf16] [--plugin PATH]
//       prints "<key><TAB><digest>" (what scripts/regen-golden-digests.sh records)
//   keel-golden --check [...]   prints the check's line; exit 1 unless it passed
//   keel-golden --repeat N      also prints the best wall time of N runs to stderr
// The CPU runs on one thread, as every golden check does. OpenBLAS's core is whatever this
// process loaded (OPENBLAS_CORETYPE decides): no re-execution toward the best one, so the
// script can record each core's digest.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "robust/golden_check.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: keel-golden [--check] [--device cpu|cuda] [--precision fp32|bf16] "
               "[--plugin PATH] [--repeat N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool check = false, cuda = false;
  keel::Precision precision = keel::Precision::kFp32;
  std::string plugin_path = "libkeel_gpt.so";
  int repeat = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--check") {
      check = true;
    } else if (a == "--device" && has_value) {
      const std::string v = argv[++i];
      if (v != "cpu" && v != "cuda") return usage();
      cuda = v == "cuda";
    } else if (a == "--precision" && has_value) {
      const std::string v = argv[++i];
      if (v != "fp32" && v != "bf16") return usage();
      precision = v == "bf16" ? keel::Precision::kBf16 : keel::Precision::kFp32;
    } else if (a == "--plugin" && has_value) {
      plugin_path = argv[++i];
    } else if (a == "--repeat" && has_value) {
      repeat = std::atoi(argv[++i]);
      if (repeat < 1) return usage();
    } else {
      return usage();
    }
  }
  try {
    auto backend = cuda ? keel::make_cuda_backend(0, precision) : keel::make_cpu_backend(1);
    auto plugin = keel::Plugin::load(plugin_path);
    keel::GoldenCheckResult r;
    double best_ms = 1e30;
    for (int i = 0; i < repeat; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      r = keel::golden_check(*backend, plugin, {}, std::nullopt, precision);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (ms < best_ms) best_ms = ms;
    }
    if (repeat > 1)
      std::fprintf(stderr, "keel-golden: best of %d runs: %.2f ms\n", repeat, best_ms);
    if (check) {
      std::printf("%s\n", r.message.c_str());
      return r.ok ? 0 : 1;
    }
    if (r.digest == 0 && !r.ok) {  // the run itself failed
      std::fprintf(stderr, "keel-golden: %s\n", r.message.c_str());
      return 1;
    }
    std::printf("%s\t0x%016" PRIx64 "\n", r.key.c_str(), r.digest);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-golden: %s\n", e.what());
    return 1;
  }
}
