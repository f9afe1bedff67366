// Knows whether a rank is waiting inside a communicator call right now, and since when: a
// decorator over the rank's communicators that marks every call. The controller compares
// ranks: when the job stalls, the ranks that wait inside a collective are the victims and a
// rank that does not is the culprit (a hung kernel, a deadlock, a stuck loop), found without
// waiting for the communicator timeout.
#pragma once

#include <atomic>
#include <memory>

#include "parallel/communicator.h"
#include "parallel/process_groups.h"

namespace keel {

// Shared by the decorators of one rank. Calls from several threads (the DP bucket thread
// and the step's thread) are counted; `since` is when the oldest running call began.
struct CommActivity {
  std::atomic<int> active{0};
  std::atomic<double> since{0};  // unix seconds, 0 when no call runs
  bool in_call() const { return active.load() > 0; }
};

// Replaces each of the groups' communicators with a decorator that records its calls in
// `activity`. Call after every (re)build, before any other decorator (fault injection wraps
// outside it, so a hang injected before the call is not counted as waiting).
void trace_communicators(ProcessGroups& groups, std::shared_ptr<CommActivity> activity);

}  // namespace keel
