// The job's record of one recovery (report::Incident), derived in one place from what the
// recovery was made of. Detection and the ladder's mechanisms note what they saw in
// Detected::found; the culprit and the rule live in the policy's Failure only; the outcome
// (epoch, restore point, rung, action, why) is the Plan's. incident_of() joins them, so no
// fact has a second copy that a later step could forget to update.
#pragma once

#include <cstdint>

#include "launcher/controller/context.h"
#include "proto/report.pb.h"
#include "robust/recovery_policy.h"

namespace keel {

// What carrying a plan out added: the epoch entered, the ranks' acknowledgements and times.
struct Transition {
  int epoch = 0;
  int ladder_rung = 0;          // robust/ladder.h: 1..4; 0 for what is no failure (growing)
  int64_t step_in_flight = 0;   // the newest step in flight when the ranks stopped
  int64_t steps_completed = 0;  // the most steps a rank had completed
  double evicted_at = 0;        // 0: no slot was evicted
  double rebuilt_at = 0;
  int64_t incident = -1;  // the index its incident took in the job's incidents (-1: none)
};

// An incident's restored_from for a restore source: "memory" (a survivor, an own snapshot, a
// backup), "persistent" or "scratch".
const char* restored_from_name(membership::Source s);

// The incident of the recovery that `plan` carried out for `d` through `t`.
report::Incident incident_of(const Detected& d, const policy::Plan& plan, const Transition& t);

}  // namespace keel
