// Knows what a rank is doing in its communicators right now: a decorator over the rank's
// five communicators that marks every call, and numbers every collective per group. The
// controller compares ranks (robust/hang_rules.h): when the job stalls, a rank that has not
// entered the collective its group's peers wait in, or that is still inside one its peers
// finished, is the culprit (a hung kernel, a deadlock, a stuck loop), found without waiting
// for the communicator timeout.
//
// Only collectives are numbered (all_reduce, reduce_scatter, all_gather, broadcast,
// barrier): every member of a group makes the same sequence of them, so the numbers agree
// across ranks. Point-to-point calls are not (in 1F1B the two sides of a PP link make
// different numbers of sends and receives); they only count as "inside a call".
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/process_groups.h"

namespace keel {

// The rank's groups, in ProcessGroups' order.
enum class CommGroup { kWorld = 0, kTp, kPp, kDp, kEmb };
inline constexpr int kCommGroups = 5;
// "world", "tp", "pp", "dp", "emb": the names reports and verdicts use.
const char* comm_group_name(CommGroup g);

// Where one group's collectives stand on this rank. Numbers start at 1 in each epoch.
struct GroupSeq {
  CommGroup group = CommGroup::kWorld;
  int64_t entered = 0;   // the collective the rank is inside now; 0 when none
  int64_t finished = 0;  // the last one that returned (0: none yet this epoch)
  double since = 0;      // unix seconds when `entered` began; 0 when none
};

// Shared by the decorators of one rank and read by its progress reporter; thread-safe (the
// DP bucket thread and the step's thread call different communicators at once).
class CommActivity {
 public:
  // Whether any call (collective or point-to-point) runs now, and since when the oldest
  // running one began (unix seconds, 0 when none).
  bool in_call() const;
  double since() const;

  // Every group's counts, as of now.
  std::array<GroupSeq, kCommGroups> groups() const;

  // A new epoch: every group's counts restart from 0. Calls still running on the old
  // epoch's communicators no longer touch the counts when they return.
  // Returns the new epoch's generation (for call marks).
  uint64_t new_epoch();

  // One call, from begin() to end(). Decorators make them; so may a test.
  struct Call {
    CommGroup group = CommGroup::kWorld;
    int64_t seq = 0;  // 0: point-to-point, or a call of an older epoch (not numbered)
    double start = 0;
    uint64_t generation = 0;
  };
  // `collective` calls are numbered in `group` when `generation` is the current one (from
  // new_epoch()); any call counts as running until end(). `completed`: it returned normally
  // (a call that throws leaves `finished` as it was).
  Call begin(CommGroup group, bool collective, uint64_t generation);
  void end(const Call& call, bool completed);

  // Fault injection (hang_in_collective): the last collective of `group` looks as if it never
  // returned: the rank is inside it again, since its start, and in a call for good.
  void stay_inside_last(CommGroup group);

 private:
  struct Group {
    int64_t next = 0, entered = 0, finished = 0;
    double since = 0, finished_start = 0;  // when `entered` and `finished` began
  };
  mutable std::mutex mu_;
  uint64_t generation_ = 0;
  std::vector<double> running_;  // start times of the running calls
  std::array<Group, kCommGroups> g_{};
};

// Replaces each of the groups' communicators with a decorator that records its calls in
// `activity`, and starts a new epoch of its counts. Call after every (re)build, before any
// other decorator (fault injection wraps outside it, so a hang injected before the call is
// not counted as waiting).
void trace_communicators(ProcessGroups& groups, std::shared_ptr<CommActivity> activity);

}  // namespace keel
