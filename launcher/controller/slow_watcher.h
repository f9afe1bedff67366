// Fail-slow, the controller's part (robust/slow_rules.h decides): every rank's round of
// figures arrives with its progress reports; once every rank of the membership sent round
// k, the detector judges it. A degrader is handed to the epoch transition to be swapped for a
// warm standby, or, where robust/recovery_policy.h's decide_slow says it cannot or should
// not be, named in an incident while the job goes on; so is a decline of the whole job that
// no rank explains.
#pragma once

#include <map>
#include <optional>
#include <set>

#include "launcher/controller/context.h"
#include "proto/control.pb.h"
#include "robust/slow_rules.h"

namespace keel {

class SlowWatcher {
 public:
  explicit SlowWatcher(const ControllerContext& ctx) : ctx_(ctx), detector_(ctx.cfg().detect()) {}

  // A rank's newest round, as its progress report carries it.
  void on_round(int rank, const control::RoundStats& round);
  // Judges the oldest round every rank sent: a degrader to swap for a standby, or nothing
  // (a warning or an mfu_decline is recorded as an incident on the spot and the job goes on).
  std::optional<Detected> judge();
  // A new epoch: every history starts over.
  void reset();
  // Of the last judged round, for progress lines (-1: none).
  int slowest_rank() const { return slowest_rank_; }
  double slowest_factor() const { return slowest_factor_; }

 private:
  // Records an incident that needs no recovery (a warning).
  void record(const report::Incident& inc);

  const ControllerContext& ctx_;
  SlowDetector detector_;
  std::map<int64_t, std::map<int, control::RoundStats>> rounds_;  // round -> rank -> stats
  int64_t judged_round_ = -1;  // the newest round judged this epoch
  std::set<int> warned_;       // degraders named in a warning this epoch
  int slowest_rank_ = -1;
  double slowest_factor_ = 0;
};

}  // namespace keel
