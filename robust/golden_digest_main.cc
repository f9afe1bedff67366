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
#include <string>

#include "robust/golden_check.h"
#include "runtime/cli.h"
#include "runtime/logging.h"

int main(int argc, char** argv) {
  keel::init_logging(argv[0]);
  CLI::App app(
      "keel-golden: runs the golden mini-GPT self-check in this process and prints "
      "\"<key><TAB><digest>\" (what scripts/regen-golden-digests.sh records).",
      "keel-golden");
  bool check = false;
  std::string device = "cpu", precision_name = "fp32";
  std::string plugin_path = "libkeel_gpt.so";
  int repeat = 1;
  app.add_flag("--check", check, "print the check's line instead; exit 1 unless it passed");
  app.add_option("--device", device, "where to run (default cpu)")
      ->type_name("cpu|cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}).description(""));
  app.add_option("--precision", precision_name, "the precision checked (default fp32)")
      ->type_name("fp32|bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}).description(""));
  app.add_option("--plugin", plugin_path, "the model plugin (default libkeel_gpt.so)")
      ->type_name("PATH");
  app.add_option("--repeat", repeat, "run N times; print the best wall time to stderr")
      ->type_name("N")
      ->check(keel::cli::range(1, 1'000'000));
  if (auto rc = keel::cli::parse(app, argc, argv)) return *rc;
  const bool cuda = device == "cuda";
  const keel::Precision precision =
      precision_name == "bf16" ? keel::Precision::kBf16 : keel::Precision::kFp32;
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
