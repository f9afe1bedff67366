// Which rank is hung, from what the ranks report (control::WorkerProgress): pure code, so
// every branch is tested with fake snapshots and no processes. The controller builds a
// HangSnapshot each poll and acts on the verdict (evict or restart the culprits). Rules,
// cheapest first:
//   liveness             a rank whose reports stopped for longer than
//                        detect.liveness_timeout_ms while its slot's agent is alive: the
//                        whole process is stopped (SIGSTOP, a wedged driver). Needs no stall.
//   collective_sequence  once the job stalled (2 typical steps + detect.hang_grace_ms): a
//                        rank still inside collective #n of a group that a peer of the group
//                        has finished (it entered and never left).
//   not_in_collective    once stalled: a rank outside every call that has not finished the
//                        collective #n its group's peers wait in (stuck in compute); or,
//                        when only point-to-point waits explain the stall, the one rank
//                        outside every call while all others wait.
// No rule fits a stall → the verdict asks the caller to capture stacks.
// No culprit is named before the epoch's first step (ranks rebuild and restore) or after
// the job's last one (rank 0 writes the report while the others wait in a barrier), nor
// while a slot's agent is dead (a slot loss, handled as one).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/topology.h"
#include "proto/control.pb.h"

namespace keel {

struct HangSnapshot {
  // The current membership's layout: which ranks share each tp/pp/dp/emb/world group.
  Topology topology{1, 1, 1};
  struct Rank {
    bool reported = false;         // a report of this epoch arrived
    control::WorkerProgress last;  // the last one (steps, in_collective, groups, alive_at)
    double age_s = 0;              // seconds since it arrived, on the controller's clock
    bool agent_alive = true;       // the heartbeats of its slot's agent are fresh
  };
  std::vector<Rank> ranks;          // by global rank; one per rank of topology
  int64_t epoch_start_step = 0;     // steps completed when this epoch began
  int64_t steps = 0;                // the job's train.steps (<= 0: unbounded)
  double stalled_s = 0;             // seconds since the slowest rank last advanced a step
  double median_step_s = 0;         // typical step time
  double liveness_timeout_s = 1.0;  // detect.liveness_timeout_ms / 1000
  double hang_grace_s = 1.5;        // detect.hang_grace_ms / 1000 (<= 0: no stall rules)
};

enum class HangRule { kNone, kLiveness, kCollectiveSequence, kNotInCollective };
// "none", "liveness", "collective_sequence", "not_in_collective".
const char* hang_rule_name(HangRule rule);

struct HangVerdict {
  std::vector<int> culprits;  // ascending; empty with kNone
  HangRule rule = HangRule::kNone;
  // One line naming the rank(s), group and sequence number, e.g.
  //   "rank 5 stopped reporting 1.2 s ago while its agent is alive (frozen)"
  //   "rank 3 is still inside dp collective #412, which its dp peers 1, 5, 7 finished"
  // With kNone: why not (empty when the job is simply training).
  std::string detail;
  // The job stalled and no rule names a culprit: capture every worker's stacks.
  bool capture_stacks = false;
};

// The verdict on one snapshot.
HangVerdict find_hang(const HangSnapshot& snapshot);

// Whether find_hang could name a culprit or ask for stacks, from figures a caller has without
// building a snapshot: the oldest report's age and the stall (the snapshot's fields of those
// names). Neither a report older than the liveness timeout nor a stall of at least the grace
// (the sequence rules' threshold is never less): no verdict. The controller copies every
// rank's report into a snapshot only then (at 4,096 ranks, 20 copies a second of each were
// its largest cost).
bool hang_possible(double oldest_report_s, double stalled_s, double liveness_timeout_s,
                   double hang_grace_s);

// "3", "0-2,4-7": ranks (any order, duplicates ignored) as ascending runs.
std::string format_ranks(std::vector<int> ranks);

}  // namespace keel
