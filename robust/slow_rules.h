// Fail-slow detection (DESIGN.md, Failure handling): a rank that does not fail but slows
// down — a throttled device, a degraded link, a noisy neighbour — drags every step of a
// synchronous job to its pace without an error. Pure code: the controller feeds it one
// complete round at a time (control::RoundStats of every rank, launcher/worker/round_meter.h) and
// acts on the verdict (robust/recovery_policy.h: evict or warn).
//
// Each round, by median and MAD over peers of the same role:
//   compute  a rank's compute time per step against the other ranks of its pipeline stage
//            (the whole job when the stage has fewer than 3 ranks): slow when it is at least
//            detect.slow_factor × their median, 3 robust deviations above it, and the excess
//            costs at least 10% of the job's step;
//   links    a link's time per message sent against the job's other links of its group kind
//            (tp, pp, dp, ...), the same way, and only when the excess costs at least 10% of a
//            step; the rank common to the slow links (as sender or receiver) is their cause.
//            Links to a rank whose compute is slow are explained by it (a busy receiver).
// A rank flagged in detect.slow_rounds of the last detect.slow_window rounds is the degrader
// (slow compute first, then a slow link). A sustained decline of the whole job with no rank
// flagged — its step time at least detect.decline_factor × the median of the rounds before
// the last slow_window (up to 50 of them), in slow_rounds of those — is an incident of its
// own, mfu_decline. The first round of an epoch (after a rebuild) is not judged.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <string>

#include "parallel/topology.h"
#include "proto/config.pb.h"
#include "proto/control.pb.h"

namespace keel {

struct SlowVerdict {
  enum class Kind { kNone, kSlowRank, kSlowLink, kMfuDecline };
  Kind kind = Kind::kNone;
  int rank = -1;       // the degrader (-1 with kNone and kMfuDecline)
  double factor = 0;   // its figure ÷ its peers' median (kMfuDecline: step time ÷ baseline)
  std::string detail;  // one line: who, what, how much, in how many rounds
  // The round's figures, per rank: compute ms/step and step ms (for the incident).
  std::string figures;
  // For progress lines, every round: the rank with the highest compute factor, and it.
  int slowest = -1;
  double slowest_factor = 0;
};
// "slow", "slow_link", "mfu_decline" ("" for kNone): the incident's kind.
const char* slow_kind_name(SlowVerdict::Kind kind);

class SlowDetector {
 public:
  explicit SlowDetector(const config::DetectConfig& dc);

  // One complete round: `ranks` holds the same round of every rank of `topo`.
  SlowVerdict observe(const Topology& topo, const std::map<int, control::RoundStats>& ranks);
  // A new epoch (rebuilt communicators, maybe other ranks): every history starts over.
  void reset();
  // After a warning about `rank`: its flags start over, so it is named again only after
  // another slow_rounds rounds of evidence.
  void forget(int rank);

 private:
  double factor_, decline_factor_;
  int need_, window_;
  int judged_ = 0;  // rounds seen this epoch
  std::map<int, std::deque<bool>> compute_flags_, link_flags_;
  std::map<int, double> last_factor_;
  std::deque<double> step_s_;    // the job's step time per round before the window
  std::deque<double> window_s_;  // ... and in the window (the last slow_window rounds)
  std::deque<bool> decline_flags_;
};

}  // namespace keel
