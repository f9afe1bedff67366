// keel-bench recovery: what surviving failures costs, measured in one invocation against a
// baseline run in the same invocation (bench/RESULTS.md records the output):
//   1. every-step snapshots on the medium CPU model, on 1 rank (local snapshot), DP2 (the
//      replica holds the backup) and DP2 with ZeRO-1 (backups pushed): runs with snapshots
//      off and on, interleaved, the step time they add, the time the step loop blocked, and
//      the host memory per rank;
//   2. the tiny TP2×PP2×DP2 job with a crash every `--every` steps, under
//      recovery.mode = in_place and restart_all (persistent checkpoints every 50 steps):
//      time from each injection to the first step after it (median, worst), steps lost and
//      ETTR.
//
//   keel-bench recovery [--medium-steps 8] [--tiny-steps 100] [--every 20] [--pairs 2]
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/scenarios.h"
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

// One layout of the medium model for the snapshot benchmark.
struct SnapLayout {
  const char* name;
  int ranks, threads;
  const char* parallel;  // the config's parallel { } body
};

void bench_snapshots(const std::string& shards, int steps, int pairs) {
  const std::string dir = fs::temp_directory_path() / "keel-bench-snap";
  fs::create_directories(dir);
  const int B = 4, T = 256;
  // 1 rank on both cores: the local snapshot only. DP2 of 1 thread each: without ZeRO-1 each
  // rank's replica holds its backup (nothing pushed); with ZeRO-1 the replicas differ and
  // each snapshot is pushed to the other rank.
  const SnapLayout layouts[] = {{"1 rank x 2 threads", 1, 2, "dp: 1"},
                                {"DP2, replica backups", 2, 1, "dp: 2"},
                                {"DP2 ZeRO-1, pushed backups", 2, 1, "dp: 2 zero1: true"}};
  std::printf(
      "== every-step snapshots: medium model (L6 d512 T256 B%d, %.1fM params), %d timed steps a "
      "run, %d pairs (off, on) interleaved, best of each\n",
      B, 19.18, steps, pairs);
  std::printf("%-28s %10s %10s %9s %9s %10s %9s %10s %12s\n", "layout", "off s/step", "on s/step",
              "cost", "blocked", "in slots", "backup", "state MB", "host MB/rank");
  for (const SnapLayout& l : layouts) {
    const std::string cfg = dir + "/medium.pbtxt";
    std::ofstream(cfg) << "model { plugin: \"" << exe_dir()
                       << "/libkeel_gpt.so\" num_layers: 6 hidden_size: 512 num_heads: 8 "
                          "seq_len: 256 vocab_size: 256 }\n"
                       << "train { micro_batch_size: " << B << " global_batch_size: " << l.ranks * B
                       << " steps: " << steps + 1 << " eval_every: 0 }\n"
                       << "parallel { " << l.parallel << " }\n"
                       << "data { train_files: \"" << shards
                       << "\" }\nruntime { threads: " << l.threads << " }\n";
    double best_off = 1e30, best_on = 1e30, blocked = 0;
    report::RunReport last_on;
    for (int p = 0; p < pairs; ++p)
      for (bool snap : {false, true}) {
        report::RunReport r =
            must_run(dir, "keel-worker",
                     (l.ranks > 1 ? "--nproc " + std::to_string(l.ranks) + " " : std::string()) +
                         "--config " + cfg +
                         " --set checkpoint.snapshot_every_step=" + (snap ? "true" : "false"));
        const double st = step_time(r) * double(l.ranks * B * T);
        if (snap) {
          best_on = std::min(best_on, st);
          blocked = r.snapshot_blocked_s() / double(steps + 1);
          last_on = r;
        } else {
          best_off = std::min(best_off, st);
        }
      }
    std::printf("%-28s %10.4f %10.4f %+8.2f%% %8.3f%% %10s %9s %10.1f %12.1f (%.2fx)\n", l.name,
                best_off, best_on, 100 * (best_on / best_off - 1), 100 * blocked / best_off,
                last_on.snapshot_in_slots() ? "yes" : "no", last_on.backup_mode().c_str(),
                last_on.snapshot_bytes() / 1e6, last_on.state_host_bytes() / 1e6,
                last_on.state_host_ratio());
    std::fflush(stdout);
  }
  std::printf(
      "cost: best step with snapshots over best without, minus 1; blocked: time the step loop "
      "waited for a snapshot, share of the step; host MB/rank: the rank's state, its two "
      "snapshot slots and the backups it holds, and that over the state's bytes\n");
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
                   "/ck-" + mode +
                   // restart_all before the first checkpoint starts the job over, as it did
                   // when these rows were first measured.
                   " --set recovery.allow_restart_from_scratch=true" + faults);
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

struct RecoveryOptions {
  int medium_steps = 8, tiny_steps = 100, every = 20, pairs = 2;
};

int recovery_main(const RecoveryOptions& o) {
  const std::string shards = random_shards(fs::temp_directory_path() / "keel-bench-data");
  if (o.medium_steps > 0) bench_snapshots(shards, o.medium_steps, o.pairs);
  if (o.tiny_steps > 0) bench_crashes(shards, o.tiny_steps, o.every);
  return 0;
}

}  // namespace

namespace bench {

Command add_recovery_command(CLI::App& app) {
  auto o = std::make_shared<RecoveryOptions>();
  CLI::App* sub = app.add_subcommand(
      "recovery", "what every-step snapshots cost, and recovery from crashes per policy");
  sub->add_option("--medium-steps", o->medium_steps,
                  "timed steps of each run of the medium model with snapshots off and on (default "
                  "8; 0 skips these rows)")
      ->option_text("N")
      ->transform(cli::whole_number(0, kMaxSteps));
  sub->add_option("--tiny-steps", o->tiny_steps,
                  "steps of the tiny TP2xPP2xDP2 job under crashes, per recovery mode (default "
                  "100; 0 skips these rows)")
      ->option_text("N")
      ->transform(cli::whole_number(0, kMaxSteps));
  sub->add_option("--every", o->every, "a crash every N steps (default 20)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxSteps));
  sub->add_option("--pairs", o->pairs,
                  "(off, on) pairs of snapshot runs, interleaved, best of each (default 2)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxRepeats));
  return {sub, [o] { return recovery_main(*o); }};
}

}  // namespace bench
}  // namespace keel
