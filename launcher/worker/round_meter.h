// A rank's own figures for fail-slow detection (robust/slow_rules.h): per step, its compute
// time (the whole step, hooks and injected delays included, less the time inside
// communicator calls), the time inside each group's calls, and per peer link the bytes and
// the time its sends took. Every detect.slow_round_steps steps the round's sums go to the
// controller in the progress report (control::RoundStats); at the job's end the per-step
// samples become the report's per-rank figures (mean, p50, p99).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/trainer.h"
#include "parallel/process_groups.h"
#include "parallel/topology.h"
#include "proto/control.pb.h"
#include "proto/report.pb.h"

namespace keel {

class RoundMeter {
 public:
  explicit RoundMeter(int round_steps) : round_steps_(round_steps) {}

  // At the start of a step, before any hook: the step's time starts here.
  void begin_step();
  // After a step (`st` as the Trainer measured it, `steps_completed` counted after it) on
  // `rank`'s communicators `groups` of layout `topo`. Returns the round that this step
  // completed, if it did (round_steps > 0).
  std::optional<control::RoundStats> end_step(int64_t steps_completed, const StepStats& st,
                                              const ProcessGroups& groups, const Topology& topo,
                                              int rank);
  // New communicators (a rebuild): their counters start at zero, and the round in progress
  // is dropped (it spans two epochs).
  void new_epoch();
  // The step's time so far (since begin_step), in seconds.
  double step_seconds() const;

  // This process's figures over the steps it measured.
  report::RankPerf perf(int rank) const;

 private:
  struct Totals {
    double wait_s = 0, bytes = 0;
    std::vector<LinkStats> links;
  };
  struct LinkKey {
    std::string group;
    int peer;
    auto operator<=>(const LinkKey&) const = default;
  };
  struct LinkSum {
    double bytes = 0, send_s = 0;
    int64_t sends = 0;
  };

  int round_steps_;
  std::chrono::steady_clock::time_point step_start_{};
  bool started_ = false;
  std::map<std::string, Totals> last_;     // cumulative counters at the last step's end
  std::vector<std::vector<int>> members_;  // per group (tp, pp, dp, emb, world), this epoch
  control::RoundStats round_;              // the round in progress
  std::map<std::string, std::pair<double, double>> round_groups_;  // wait_s, bytes
  std::map<LinkKey, LinkSum> round_links_;
  int round_steps_done_ = 0;
  // Per-step samples of one figure: every one while few, then every 2nd, 4th, ... so that a
  // job of millions of steps keeps a bounded, evenly spread set. The mean is exact.
  struct Samples {
    std::vector<double> kept;
    int64_t seen = 0, stride = 1;
    double sum = 0;
    void add(double x);
  };
  Samples compute_samples_;
  std::map<LinkKey, Samples> link_samples_;
  std::map<LinkKey, double> link_bytes_;
};

}  // namespace keel
