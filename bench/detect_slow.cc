#include "bench/detect_slow.h"

#include <cstdio>

#include "bench/bench_util.h"

namespace keel::bench {
namespace {

constexpr int kRound = 10;  // detect.slow_round_steps (the default)
constexpr int kOnset = 100, kSteps = 300, kRank = 5;

bool is_slow_kind(const std::string& k) {
  return k == "slow" || k == "slow_link" || k == "mfu_decline";
}

}  // namespace

void fail_slow_rows(const std::string& dir, const std::function<std::string(int)>& config,
                    const std::string& sets, int healthy_steps) {
  const std::string launch =
      "--local 6 --standby 2 --workers-per-slot 2 --set detect.slow_round_steps=" +
      std::to_string(kRound) + sets + " --config ";
  // Fault-free: the healthy step time, and what a detector flags when nothing is wrong.
  const report::RunReport clean = must_run(dir, "keel-launch", launch + config(healthy_steps));
  int flagged = 0;
  for (const auto& inc : clean.incidents()) flagged += is_slow_kind(inc.kind()) ? 1 : 0;
  const double step_s = clean.wall_s() / std::max(1, clean.steps_completed());
  std::printf(
      "\n== fail-slow: rank %d slowed from step %d (slow fault: delay = (factor - 1) x the "
      "healthy step of %.1f ms), rounds of %d steps, detect.slow_factor 1.5, 3 of 5 rounds\n",
      kRank, kOnset, 1000 * step_s, kRound);
  std::printf("%-10s %10s %12s %18s %8s %10s %s\n", "slowdown", "delay ms", "flagged",
              "rounds to detect", "rank", "action", "bitwise");
  const report::RunReport ref = must_run(dir, "keel-launch", launch + config(kSteps));
  for (double factor : {1.5, 2.0, 4.0}) {
    const int delay = std::max(1, int((factor - 1) * 1000 * step_s));
    const report::RunReport r =
        must_run(dir, "keel-launch",
                 launch + config(kSteps) + " --fault slow@step=" + std::to_string(kOnset) +
                     ",rank=" + std::to_string(kRank) + ",delay_ms=" + std::to_string(delay));
    const report::Incident* hit = nullptr;
    for (const auto& inc : r.incidents())
      if (inc.kind() == "slow" && !hit) hit = &inc;
    char rounds[32] = "-", rank[16] = "-";
    if (hit) {
      std::snprintf(rounds, sizeof(rounds), "%.1f", double(hit->step() - kOnset) / kRound);
      std::snprintf(rank, sizeof(rank), "%d", hit->rank());
    }
    std::printf("%-10s %10d %12s %18s %8s %10s %s\n",
                (std::to_string(factor).substr(0, 3) + "x").c_str(), delay, hit ? "yes" : "NO",
                rounds, rank, hit ? hit->rung().c_str() : "-",
                r.param_checksum() == ref.param_checksum() ? "yes" : "NO");
  }
  std::printf("false positives: %d in %d fault-free steps (%.2f per 1,000 steps)\n", flagged,
              healthy_steps, 1000.0 * flagged / std::max(1, healthy_steps));
  std::fflush(stdout);
}

}  // namespace keel::bench
