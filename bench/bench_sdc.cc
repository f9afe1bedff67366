// keel-bench sdc: what the in-flight silent data corruption checks cost (issue 15,
// robust/sdc_check.h), as a wall-clock ratio against the same job with the checks off, run in
// the same invocation (bench/RESULTS.md records the output). Two layouts:
//   - the medium CPU model (L6 d512 T256 B4) as DP2: 2 ranks of 1 thread;
//   - tiny 3-D (examples/configs/tiny-gpt-3d.pbtxt): TP2 x PP2 x DP2, 8 ranks.
// For each period N the job runs with sdc.check_every_steps = 0 and N, interleaved round by
// round, best of each. The trainer's step time (the report's tokens_per_s) leaves the
// recomputation out (it runs before the step), so a step's time comes from the whole run's
// wall clock: (wall of a 1 + L step run - wall of a 1-step run) / L, the 1-step run with the
// same setting (checks on with a period longer than the run: the start state's verified
// copy, no check). A period above --*-max-steps is not run: its cost is derived from the
// smallest period's measured per-check cost, and marked so.
//
//   keel-bench sdc [--medium-steps 20] [--medium-max-steps 20] [--medium-micro 1]
//                  [--tiny-steps 600] [--tiny-max-steps 1000] [--rounds 2]
//                  [--every 1,10,50,100] [--no-breakdown]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/scenarios.h"
#include "proto/config_loader.h"
#include "proto/report.pb.h"

#ifndef KEEL_SOURCE_DIR
#define KEEL_SOURCE_DIR "."
#endif

namespace keel {
namespace {

using bench::exe_dir;
using bench::must_run;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr double kTarget = 0.02;   // the ceiling on the check's share at the default N
constexpr int kNoCheck = 1 << 30;  // checks on, period longer than any run: setup only

struct Layout {
  std::string name;
  int nproc;
  std::string args;  // --config and --set: all but the steps and the check period
  int steps;         // timed steps of a run (at least N for period N)
  int max_steps;     // periods needing longer runs are derived, not run
  int micro;         // micro-batches per DP replica per step: a check recomputes one of them
};

struct Timed {
  double wall = 1e30;  // the best run's wall clock, process start to report read
  report::RunReport rep;
};

// One run: a warm-up step and `timed` more, checks every `every` steps.
Timed run_once(const std::string& dir, const Layout& l, int timed, int every,
               const std::string& extra = "") {
  const auto t0 = Clock::now();
  Timed t;
  t.rep = must_run(dir, "keel-worker",
                   "--nproc " + std::to_string(l.nproc) + " " + l.args +
                       " --set train.steps=" + std::to_string(timed + 1) +
                       " --set sdc.check_every_steps=" + std::to_string(every) + extra);
  t.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  return t;
}

void keep_best(Timed* best, Timed t) {
  if (t.wall < best->wall) *best = std::move(t);
}

// The timed steps of period `n`'s runs: at least --steps, a whole number of periods.
int run_length(const Layout& l, int n) {
  const int len = std::max(l.steps, n);
  return (len + n - 1) / n * n;
}

void bench_layout(const std::string& dir, const Layout& l, const std::vector<int>& periods,
                  int rounds, bool breakdown) {
  std::vector<int> measured, derived;
  for (int n : periods) (run_length(l, n) <= l.max_steps ? measured : derived).push_back(n);
  std::set<int> lengths;
  for (int n : measured) lengths.insert(run_length(l, n));

  Timed setup_off, setup_on;
  std::map<int, Timed> off;  // by run length
  std::map<int, Timed> on;   // by period
  for (int r = 0; r < rounds; ++r) {
    keep_best(&setup_off, run_once(dir, l, 0, 0));
    keep_best(&setup_on, run_once(dir, l, 0, kNoCheck));
    for (int len : lengths) {
      keep_best(&off[len], run_once(dir, l, len, 0));
      for (int n : measured)
        if (run_length(l, n) == len) keep_best(&on[n], run_once(dir, l, len, n));
    }
  }
  const report::RunReport& any = setup_off.rep;
  std::printf(
      "\n== %s: %s on %d ranks, %.1fM params, %d micro-batch(es) per replica per "
      "step; %s, BLAS core %s (chosen by %s)\n",
      l.name.c_str(), any.layout().c_str(), any.world_size(), any.num_params() / 1e6, l.micro,
      any.cpu_model().c_str(), any.blas_core().c_str(), any.blas_core_chosen_by().c_str());
  std::printf("setup (1-step run): %.2f s off, %.2f s on; %d round(s) interleaved, best of each\n",
              setup_off.wall, setup_on.wall, rounds);
  std::printf("%6s %7s %7s %11s %11s %10s %13s %9s %12s %13s\n", "N", "steps", "checks",
              "off s/step", "on s/step", "overhead", "wall s/check", "| report:", "s/check",
              "check share");
  auto per_step = [](const Timed& t, const Timed& setup, int len) {
    return (t.wall - setup.wall) / len;
  };
  // The per-check wall cost at the smallest measured period, for the derived rows.
  double check_s = 0, ref_step = 0, ref_share = 0;
  int ref_n = 0;
  for (int n : measured) {
    const int len = run_length(l, n);
    const double t_off = per_step(off[len], setup_off, len);
    const double t_on = per_step(on[n], setup_on, len);
    const report::RunReport& rep = on[n].rep;
    const double s_check = rep.sdc_checks() > 0 ? rep.sdc_check_seconds() / rep.sdc_checks() : 0;
    std::printf("%6d %7d %7d %11.4f %11.4f %+9.2f%% %13.4f %9s %12.4f %12.2f%%%s\n", n, len,
                len / n, t_off, t_on, 100 * (t_on / t_off - 1), (t_on - t_off) * n, "", s_check,
                100 * rep.sdc_check_share(), n == kDefaultSdcCheckEverySteps ? "  (default)" : "");
    if (ref_n == 0) {
      ref_n = n;
      check_s = (t_on - t_off) * n;
      ref_step = t_off;
      ref_share = rep.sdc_check_share() * n;
    }
  }
  for (int n : derived)
    std::printf("%6d %7s %7s %11.4f %11s %+9.2f%% %13s %9s %12s %12.2f%%%s  (derived from N=%d)\n",
                n, "-", "-", ref_step, "-", ref_n ? 100 * check_s / (n * ref_step) : 0.0, "-", "",
                "-", 100 * ref_share / n, n == kDefaultSdcCheckEverySteps ? "  (default)" : "",
                ref_n);
  if (ref_n > 0) {
    std::printf(
        "one check: %.4f s of wall clock (N=%d: (on - off) x N) = %.2f steps; the "
        "smallest N with overhead <= %.0f%%: %d\n",
        check_s, ref_n, check_s / ref_step, 100 * kTarget,
        int(std::ceil(check_s / (kTarget * ref_step))));
  }
  if (breakdown && ref_n > 0) {
    // Without snapshots there is no verified slot to copy the state into: the difference in
    // the report's time per check is that copy.
    const int len = std::max(ref_n, run_length(l, ref_n) / 4 / ref_n * ref_n);
    const Timed nosnap =
        run_once(dir, l, len, ref_n, " --set checkpoint.snapshot_every_step=false");
    const report::RunReport& with = on[ref_n].rep;
    const double a = with.sdc_checks() ? with.sdc_check_seconds() / with.sdc_checks() : 0;
    const double b =
        nosnap.rep.sdc_checks() ? nosnap.rep.sdc_check_seconds() / nosnap.rep.sdc_checks() : 0;
    std::printf(
        "report s/check at N=%d: %.4f with snapshots, %.4f without (no verified-slot "
        "copy): the copy ~%.4f s\n",
        ref_n, a, b, a - b);
  }
  std::fflush(stdout);
}

struct SdcOptions {
  int medium_steps = 20, medium_max = 20, medium_micro = 1, tiny_steps = 600, tiny_max = 1000,
      rounds = 2;
  bool no_breakdown = false;
  std::vector<int> every = {1, 10, 100, kDefaultSdcCheckEverySteps};
};

int sdc_main(const SdcOptions& o) {
  const int medium_steps = o.medium_steps, medium_max = o.medium_max, medium_micro = o.medium_micro,
            tiny_steps = o.tiny_steps, tiny_max = o.tiny_max, rounds = o.rounds;
  const bool breakdown = !o.no_breakdown;
  std::vector<int> periods = o.every;
  std::sort(periods.begin(), periods.end());
  periods.erase(std::unique(periods.begin(), periods.end()), periods.end());
  const std::string dir = fs::temp_directory_path() / "keel-bench-sdc";
  fs::create_directories(dir);
  const std::string shards = bench::random_shards(fs::temp_directory_path() / "keel-bench-data");
  const std::string plugin = exe_dir() + "/libkeel_gpt.so";
  std::printf(
      "== in-flight SDC checks (sdc.check_every_steps = N) against off; overhead: wall "
      "clock per step, on over off, minus 1; report: rank 0's sdc_check_seconds per "
      "check and sdc_check_share (its time in checks over its trainer step time)\n");
  if (medium_steps > 0) {
    const int B = 4;
    const std::string cfg = dir + "/medium.pbtxt";
    std::ofstream(cfg) << "model { plugin: \"" << plugin
                       << "\" num_layers: 6 hidden_size: 512 num_heads: 8 seq_len: 256 "
                          "vocab_size: 256 }\n"
                       << "train { micro_batch_size: " << B
                       << " global_batch_size: " << 2 * B * medium_micro << " eval_every: 0 }\n"
                       << "parallel { dp: 2 }\n"
                       << "data { train_files: \"" << shards << "\" }\nruntime { threads: 1 }\n";
    bench_layout(dir,
                 {"medium GPT (L6 d512 T256 B4) DP2, 1 thread per rank", 2, "--config " + cfg,
                  medium_steps, medium_max, medium_micro},
                 periods, rounds, breakdown);
  }
  if (tiny_steps > 0) {
    const std::string args = std::string("--config ") + KEEL_SOURCE_DIR +
                             "/examples/configs/tiny-gpt-3d.pbtxt --set model.plugin=" + plugin +
                             " --set 'data.train_files=" + shards +
                             "' --set data.val_files= --set train.eval_every=0";
    bench_layout(dir,
                 {"tiny 3-D (tiny-gpt-3d.pbtxt) TP2xPP2xDP2", 8, args, tiny_steps, tiny_max, 2},
                 periods, rounds, breakdown);
  }
  return 0;
}

}  // namespace

namespace bench {

Command add_sdc_command(CLI::App& app) {
  auto o = std::make_shared<SdcOptions>();
  CLI::App* sub =
      app.add_subcommand("sdc", "what the in-flight silent-data-corruption checks cost a step");
  sub->add_option("--medium-steps", o->medium_steps,
                  "timed steps of a run of the medium model as DP2, at least N (default 20; 0 "
                  "skips this layout)")
      ->option_text("N")
      ->transform(cli::whole_number(0, kMaxSteps));
  sub->add_option("--medium-max-steps", o->medium_max,
                  "the medium layout's longest run: periods needing longer ones are derived, not "
                  "run (default 20)")
      ->option_text("N")
      ->transform(cli::whole_number(0, kMaxSteps));
  sub->add_option("--medium-micro", o->medium_micro,
                  "micro-batches per replica per step of the medium model (default 1)")
      ->option_text("N")
      ->transform(cli::whole_number(1, cli::kMaxCount));
  sub->add_option("--tiny-steps", o->tiny_steps,
                  "timed steps of a run of the tiny 3-D job (default 600; 0 skips this layout)")
      ->option_text("N")
      ->transform(cli::whole_number(0, kMaxSteps));
  sub->add_option("--tiny-max-steps", o->tiny_max,
                  "the tiny layout's longest run: periods needing longer ones are derived, not "
                  "run (default 1000)")
      ->option_text("N")
      ->transform(cli::whole_number(0, kMaxSteps));
  sub->add_option("--rounds", o->rounds, "interleaved rounds, best of each (default 2)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxRepeats));
  std::set<int> defaults(o->every.begin(), o->every.end());
  std::string periods;
  for (int n : defaults) periods += (periods.empty() ? "" : ",") + std::to_string(n);
  sub->add_option("--every", o->every,
                  "the check periods N, comma-separated (default " + periods + ")")
      ->option_text("N1,N2,...")
      ->delimiter(',')
      ->transform(cli::whole_number(1, kMaxSteps));
  sub->add_flag("--no-breakdown", o->no_breakdown,
                "skip the run without snapshots that prices the verified-slot copy");
  return {sub, [o] { return sdc_main(*o); }};
}

}  // namespace bench
}  // namespace keel
