// keel-bench-recovery: what surviving failures costs, measured in one invocation against a
// baseline run in the same invocation (bench/RESULTS.md records the output):
//   1. every-step snapshots on the medium CPU model (DP2, so each snapshot is also pushed
//      to a backup holder): runs with snapshots off and on, interleaved, and the step time
//      they add, the time the step loop blocked on a copy, memory and backup bytes per step;
//   2. the tiny TP2×PP2×DP2 job with a crash every `--every` steps, under
//      recovery.mode = in_place and restart_all (persistent checkpoints every 50 steps):
//      time from each injection to the first step after it (median, worst), steps lost and
//      ETTR.
//
//   keel-bench-recovery [--medium-steps 8] [--tiny-steps 100] [--every 20] [--pairs 2]
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "model/token_shards.h"
#include "proto/report.pb.h"

namespace keel {
namespace {

using bench::exe_dir;
using bench::must_run;
using bench::random_shards;

namespace fs = std::filesystem;

double step_time(const report::RunReport& r) {
  // tokens_per_s leaves out the first step (warm-up); tokens per step from the config.
  return r.tokens_per_s() > 0 ? 1.0 / r.tokens_per_s() : 0;
}

void bench_snapshots(const std::string& shards, int steps, int pairs) {
  const std::string dir = fs::temp_directory_path() / "keel-bench-snap";
  fs::create_directories(dir);
  const std::string cfg = dir + "/medium.pbtxt";
  const int B = 8, T = 256;
  std::ofstream(cfg) << "model { plugin: \"" << exe_dir()
                     << "/libkeel_gpt.so\" num_layers: 6 hidden_size: 512 num_heads: 8 "
                        "seq_len: 256 vocab_size: 256 }\n"
                     << "train { micro_batch_size: " << B << " global_batch_size: " << 2 * B
                     << " steps: " << steps + 1 << " }\n"
                     << "parallel { dp: 2 }\n"
                     << "data { train_files: \"" << shards << "\" }\nruntime { threads: 1 }\n";
  std::printf(
      "== every-step snapshots: medium model (L6 d512 T256, %.1fM params), DP2 on 2 ranks of 1 "
      "thread, %d timed steps a run, %d pairs (off, on) interleaved\n",
      19.18, steps, pairs);
  std::printf("%-5s %-4s %12s %12s %14s %14s %14s\n", "run", "snap", "step s", "blocked s/step",
              "snapshot MB", "shm MB/rank", "backup MB/step");
  std::vector<double> off, on, blocked;
  double snap_mb = 0, backup_mb = 0;
  for (int p = 0; p < pairs; ++p)
    for (bool snap : {false, true}) {
      report::RunReport r =
          must_run(dir, "keel-worker",
                   "--nproc 2 --config " + cfg +
                       " --set checkpoint.snapshot_every_step=" + (snap ? "true" : "false"));
      const double st = step_time(r) * double(2 * B * T);
      (snap ? on : off).push_back(st);
      const double blk = r.snapshot_blocked_s() / double(steps + 1);
      if (snap) {
        blocked.push_back(blk);
        snap_mb = r.snapshot_bytes() / 1e6;
        backup_mb = r.backup_bytes_per_step() / 1e6;
      }
      std::printf("%-5d %-4s %12.4f %12.5f %14.1f %14.1f %14.1f\n", p + 1, snap ? "on" : "off", st,
                  snap ? blk : 0.0, snap ? snap_mb : 0.0, snap ? 4 * snap_mb : 0.0,
                  snap ? backup_mb : 0.0);
      std::fflush(stdout);
    }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / double(v.size());
  };
  const double m_off = mean(off), m_on = mean(on), m_blk = mean(blocked);
  std::printf(
      "mean step: off %.4f s, on %.4f s: ratio on/off %.4f (%+.2f%%); blocked by the snapshot "
      "%.5f s/step = %.3f%% of the step; shared memory per rank %.1f MB (2 own slots + 2 "
      "backup slots of %.1f MB); backup traffic %.1f MB/step per rank\n",
      m_off, m_on, m_on / m_off, 100 * (m_on / m_off - 1), m_blk, 100 * m_blk / m_off, 4 * snap_mb,
      snap_mb, backup_mb);
}

struct Faulted {
  std::vector<double> recover_s;  // injection -> first step after it
  int steps_lost = 0;
  double ettr = 0, wall = 0;
  std::string checksum;
};

Faulted faulted_run(const std::string& dir, const std::string& cfg, int steps, int every,
                    const std::string& mode) {
  std::string faults;
  for (int s = every, k = 0; s < steps; s += every, ++k)
    faults += " --fault crash@step=" + std::to_string(s) + ",rank=" + std::to_string(1 + k % 7);
  report::RunReport r =
      must_run(dir, "keel-worker",
               "--nproc 8 --config " + cfg + " --set recovery.mode=" + mode +
                   " --set checkpoint.persistent_every_steps=50 --set checkpoint.dir=" + dir +
                   "/ck-" + mode + faults);
  Faulted f;
  for (const auto& inc : r.incidents()) {
    f.recover_s.push_back(inc.first_step_at() - inc.injected_at());
    f.steps_lost += inc.steps_lost();
  }
  f.ettr = r.ettr();
  f.wall = r.wall_s();
  f.checksum = r.param_checksum();
  fs::remove_all(dir + "/ck-" + mode);
  return f;
}

void bench_crashes(const std::string& shards, int steps, int every) {
  const std::string dir = fs::temp_directory_path() / "keel-bench-crash";
  fs::create_directories(dir);
  const std::string cfg = dir + "/tiny3d.pbtxt";
  std::ofstream(cfg) << "model { plugin: \"" << exe_dir()
                     << "/libkeel_gpt.so\" num_layers: 2 hidden_size: 64 num_heads: 4 "
                        "seq_len: 64 vocab_size: 256 }\n"
                     << "train { micro_batch_size: 2 global_batch_size: 16 steps: " << steps
                     << " }\nparallel { tp: 2 pp: 2 dp: 2 }\n"
                     << "data { train_files: \"" << shards << "\" }\nruntime { threads: 1 }\n";
  std::printf(
      "\n== the tiny TP2xPP2xDP2 job (8 ranks), %d steps, a crash (SIGKILL) every %d steps; "
      "restart_all resumes from persistent checkpoints taken every 50 steps\n",
      steps, every);
  report::RunReport clean = must_run(dir, "keel-worker", "--nproc 8 --config " + cfg);
  std::printf("fault-free: %.2f s wall, ETTR %.3f, params %s\n", clean.wall_s(), clean.ettr(),
              clean.param_checksum().c_str());
  std::printf("%-12s %10s %14s %14s %11s %8s %10s %s\n", "mode", "incidents", "median s", "worst s",
              "steps lost", "ETTR", "wall s", "params");
  double median_in_place = 0;
  for (const std::string mode : {"in_place", "restart_all"}) {
    Faulted f = faulted_run(dir, cfg, steps, every, mode);
    std::vector<double> v = f.recover_s;
    std::sort(v.begin(), v.end());
    const double median = v.empty() ? 0 : v[v.size() / 2], worst = v.empty() ? 0 : v.back();
    if (mode == "in_place") median_in_place = median;
    std::printf("%-12s %10zu %14.3f %14.3f %11d %8.3f %10.2f %s%s\n", mode.c_str(), v.size(),
                median, worst, f.steps_lost, f.ettr, f.wall, f.checksum.c_str(),
                f.checksum == clean.param_checksum() ? " (= fault-free)" : " (DIFFERS)");
    if (mode == "restart_all" && median_in_place > 0)
      std::printf("restart_all / in_place, median time from crash to next step: %.1fx\n",
                  median / median_in_place);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace keel

int main(int argc, char** argv) {
  using namespace keel;
  int medium_steps = 8, tiny_steps = 100, every = 20, pairs = 2;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--medium-steps")
      medium_steps = next();
    else if (a == "--tiny-steps")
      tiny_steps = next();
    else if (a == "--every")
      every = next();
    else if (a == "--pairs")
      pairs = next();
    else {
      std::fprintf(stderr,
                   "usage: keel-bench-recovery [--medium-steps 8] [--tiny-steps 100] "
                   "[--every 20] [--pairs 2]\n");
      return 2;
    }
  }
  const std::string shards = random_shards(fs::temp_directory_path() / "keel-bench-data");
  if (medium_steps > 0) bench_snapshots(shards, medium_steps, pairs);
  if (tiny_steps > 0) bench_crashes(shards, tiny_steps, every);
  return 0;
}
