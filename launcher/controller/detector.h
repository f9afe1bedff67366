// What the controller counts as a failure, cheapest signal first: a worker's exit (its
// agent reports it within 20 ms), a slot whose heartbeats stopped, a communication error a
// rank reported through the store (an SDC verdict, new code on probation), and hangs
// (robust/hang_rules.h: reports that stopped, collective sequence numbers, and when neither
// names a culprit, the workers' stacks). It keeps the ranks' progress reports of the epoch,
// which the hang rules, keel-ctl status and the abort deadline read.
#pragma once

#include <map>
#include <optional>
#include <utility>

#include "launcher/controller/context.h"
#include "proto/control.pb.h"

namespace keel {

class Detector {
 public:
  // `watch_progress`: progress reports arrive (a control plane): hangs can be detected.
  Detector(const ControllerContext& ctx, bool watch_progress)
      : ctx_(ctx), watch_progress_(watch_progress) {}

  // --- the ranks' progress in this epoch ---
  using Report = std::pair<control::WorkerProgress, Clock::time_point>;  // and when it came
  // Taken, not copied: at thousands of ranks the copies were a tenth of the controller's CPU.
  void on_progress(control::WorkerProgress p) {
    const int rank = p.rank();
    progress_[rank] = {std::move(p), Clock::now()};
  }
  void forget(int rank) { progress_.erase(rank); }
  const std::map<int, Report>& progress() const { return progress_; }
  // A new epoch restores `start_step`: every report starts over.
  void new_epoch(int64_t start_step);
  // The step every rank has reached, as of the last hang check (-1: none yet this epoch).
  int64_t min_step() const { return last_min_step_; }
  // The newest step any rank reported (at least the epoch's first).
  int64_t ahead() const;
  double median_step_s() const;

  // --- failures ---
  Detected from_exit(const RankExit& ex);
  // A communication error the ranks reported in the membership's epoch.
  std::optional<Detected> comm_error();
  // A rank named hung (killed already); `incident`: the number the incident will get, which
  // names a stacks capture.
  std::optional<Detected> hang(int incident);
  // Silence alone cannot tell a dead machine from a cut network; an injected fault on the
  // slot can.
  void label_slot_loss(Detected* d, const RankExit& ex);
  // An exit seen while the survivors answer an abort: joins `d` (and may name its culprit).
  void fold_exit(Detected* d, const RankExit& ex);
  // A survivor that did not answer the abort within `ms`: killed, and joins `d` as hung.
  void fold_unanswered(Detected* d, int rank, int64_t ms);

 private:
  // The verdict of a failed SDC check, if the ranks' failure was one (robust/sdc_check.h).
  std::optional<Detected> sdc();

  const ControllerContext& ctx_;
  bool watch_progress_;
  std::map<int, Report> progress_;
  int64_t epoch_start_step_ = 0;
  int64_t last_min_step_ = -1;
  Clock::time_point last_advance_ = Clock::now();
  Clock::time_point stacks_for_stall_{};  // the stall (last_advance_) whose stacks were taken
  Clock::time_point next_hang_check_{};   // hang() judges no more often than kHangCheckEvery
};

}  // namespace keel
