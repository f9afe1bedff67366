// The job's one record in etcd (state::JobState, proto/control_state.proto), as the leader
// controller builds it from what it decides with and reads it back when it takes over: the
// conversions between the record and the memory of the pure decisions in robust/ (the stop
// rules', the ladder's), and the key that says whether the record changed. Runs in the
// controller.
#pragma once

#include <string>

#include "proto/control_state.pb.h"
#include "robust/ladder.h"
#include "robust/stop_rules.h"

namespace keel {

state::StopCounts stop_counts(const policy::StopMemory& m);
policy::StopMemory stop_memory(const state::StopCounts& c);
state::LadderMemory ladder_record(const policy::LadderMemory& m);
policy::LadderMemory ladder_memory(const state::LadderMemory& r);

// What of the record is worth a write between epoch transitions, serialized: each slot's role
// and standby check (not its link, lost or up: the agents' to tell a new leader), the
// decisions' memory, the update and the command log's progress; not the rank -> slot map or
// the Rebuild, which only a transition changes, and it writes the record itself (so the key
// stays small at 100k ranks). Equal keys: nothing to write.
std::string job_state_key(const state::JobState& js);

}  // namespace keel
