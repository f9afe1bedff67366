// The CPU-speed report: how fast this machine's BLAS is by core type, how close the medium
// GPT gets to the best of them with nothing set by the user, and what every-step snapshots
// and restores cost. Every figure is measured in this invocation; the OpenBLAS core of each
// SGEMM row is set in a child process, as OpenBLAS reads OPENBLAS_CORETYPE only at load.
#include "bench/cpu_speed.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "runtime/cpu/blas_core.h"
#include "runtime/cpu/cpu_features.h"
#include "runtime/logging.h"

namespace keel::bench {
namespace {

namespace fs = std::filesystem;

// What the user's shell may have set; every child starts without it.
const char* kClearBlas = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u OPENBLAS_NUM_THREADS ";

// Runs `cmd`, returns its stdout ("" on failure).
std::string output_of(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof(buf), p)) out += buf;
    if (::pclose(p) != 0) out.clear();
  }
  return out;
}

struct Sgemm {
  std::string asked, core;  // the core type set ("" for none) and the one OpenBLAS ran
  double gflops = 0;
};

Sgemm sgemm_under(const std::string& core, int threads) {
  const std::string cmd = std::string(kClearBlas) +
                          (core.empty() ? "" : "OPENBLAS_CORETYPE=" + core + " ") + exe_dir() +
                          "/keel-bench cpu --sgemm-child --threads " + std::to_string(threads);
  Sgemm s;
  s.asked = core;
  // The child prints one line, "<core> <GFLOP/s>".
  std::istringstream out(output_of(cmd));
  std::string ran;
  if (out >> ran >> s.gflops) s.core = ran;
  return s;
}

struct Medium {
  std::string label;
  report::RunReport r;
};

// The medium GPT of the acceptance check: L6 d512 T256 V256, B4, 8 steps, 2 threads.
Medium medium_run(const std::string& label, const std::string& extra, int threads) {
  const std::string dir = fs::temp_directory_path() / "keel-bench-speed";
  fs::create_directories(dir);
  const std::string shards = random_shards(dir + "/data");
  const std::string cfg = dir + "/medium.pbtxt";
  std::ofstream(cfg)
      << "model { plugin: \"" << exe_dir()
      << "/libkeel_gpt.so\" num_layers: 6 hidden_size: 512 num_heads: 8 "
         "seq_len: 256 vocab_size: 256 }\n"
      << "train { micro_batch_size: 4 global_batch_size: 4 steps: 8 eval_every: 0 }\n"
      << "data { train_files: \"" << shards << "\" }\nruntime { threads: " << threads << " }\n";
  const std::string report = dir + "/report.json";
  fs::remove(report);
  const std::string cmd = std::string(kClearBlas) + exe_dir() + "/keel-worker --quiet --config " +
                          cfg + " --report " + report + " " + extra + " > " + dir + "/run.log 2>&1";
  Medium m{label, {}};
  if (std::system(cmd.c_str()) != 0 || !read_report(report, &m.r))
    LOG(ERROR) << "medium run '" << label << "' failed (see " << dir << "/run.log)";
  return m;
}

}  // namespace

int sgemm_child(int threads) {
  constexpr int n = 2048;
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 97) * 0.01f;
    b[i] = float(i % 89) * 0.01f;
  }
  openblas_set_num_threads(threads);
  double best = 1e30;
  for (int rep = 0; rep < 13; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= 3) best = std::min(best, s);  // three warm-ups
  }
  std::printf("%s %.1f\n", openblas_get_corename(), 2.0 * n * n * n / best / 1e9);
  return 0;
}

int cpu_speed_report(int threads) {
  const CpuFeatures& cpu = cpu_features();
  std::printf("== CPU speed: %s, %s, %d thread(s)\n", cpu.describe().c_str(), cpu.isa().c_str(),
              threads);

  // 1. SGEMM 2048³ by OpenBLAS core type, each in a process of its own.
  std::printf("\n-- SGEMM 2048^3, %d threads, by OpenBLAS core type (best of 10)\n", threads);
  std::printf("%-22s %-14s %10s\n", "OPENBLAS_CORETYPE", "core run", "GFLOP/s");
  std::vector<std::string> cores = {"", best_blas_core(cpu), "SkylakeX", "Haswell", "Prescott"};
  std::vector<std::string> seen;
  double best = 0;
  std::string best_core;
  for (const std::string& core : cores) {
    if (std::find(seen.begin(), seen.end(), core) != seen.end()) continue;
    seen.push_back(core);
    const Sgemm s = sgemm_under(core, threads);
    std::printf("%-22s %-14s %10.1f\n", core.empty() ? "(not set)" : core.c_str(), s.core.c_str(),
                s.gflops);
    if (s.gflops > best) best = s.gflops, best_core = s.core;
  }
  std::printf("best: %.1f GFLOP/s (%s). Other libraries: bench/bench_gemm_backends.sh.\n", best,
              best_core.c_str());

  // 2. The medium GPT with nothing set, and with the core forced.
  std::printf(
      "\n-- medium GPT (L6 d512 T256 B4, 8 steps, %d threads): model FLOPs over the best "
      "SGEMM above, and the MFU keel reports\n",
      threads);
  std::printf("%-28s %-12s %10s %12s %12s %10s\n", "run", "core", "tok/s", "GFLOP/s", "of best",
              "keel MFU");
  std::vector<std::string> refused;
  std::vector<Medium> runs = {medium_run("nothing set", "", threads)};
  if (!best_core.empty())
    runs.push_back(medium_run("runtime.blas_core=" + best_core,
                              "--set runtime.blas_core=" + best_core, threads));
  runs.push_back(
      medium_run("runtime.blas_core=Haswell", "--set runtime.blas_core=Haswell", threads));
  for (const Medium& m : runs) {
    // 6N + 12·L·d·T for the GPT (DESIGN.md, Numbers that matter).
    const double L = 6, d = 512, T = 256, V = 256;
    const double flops = 6 * (12 * L * d * d + (V + T) * d) + 12 * L * d * T;
    const double gf = flops * m.r.tokens_per_s() / 1e9;
    char mfu[32];
    std::snprintf(mfu, sizeof(mfu), "%.1f%%", 100 * m.r.mfu());
    if (!m.r.mfu_unavailable().empty()) {
      std::snprintf(mfu, sizeof(mfu), "n/a (%zu)", refused.size() + 1);
      refused.push_back(m.r.mfu_unavailable());
    }
    std::printf("%-28s %-12s %10.0f %12.1f %11.1f%% %10s\n", m.label.c_str(),
                m.r.blas_core().c_str(), m.r.tokens_per_s(), gf, best > 0 ? 100 * gf / best : 0,
                mfu);
  }
  for (size_t i = 0; i < refused.size(); ++i)
    std::printf("(%zu) keel refused its MFU: %s\n", i + 1, refused[i].c_str());
  std::fflush(stdout);

  // 3-4. Snapshot cost and host memory; restore throughput.
  std::printf("\n");
  std::fflush(stdout);
  int rc = std::system((std::string(kClearBlas) + exe_dir() +
                        "/keel-bench recovery --tiny-steps 0 --medium-steps 8 --pairs 3")
                           .c_str());
  std::printf("\n");
  std::fflush(stdout);
  rc |= std::system((exe_dir() + "/keel-bench restore --sizes medium,1g").c_str());
  return rc == 0 ? 0 : 1;
}

}  // namespace keel::bench
