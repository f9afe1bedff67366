// What the faults that act on a rank's surroundings do in keel-worker: to its snapshot
// (corrupt_snapshot, lose_snapshot) and to its slot (slot_loss, partition). The injector
// (robust/fault_injector.h) decides when; these say how, with the worker's own objects.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/snapshot_region.h"
#include "ckpt/snapshotter.h"
#include "proto/control_state.pb.h"
#include "robust/fault_injector.h"

namespace keel {

// Both borrow: they must outlive the actions.
FaultInjector::SnapshotActions snapshot_fault_actions(Snapshotter* snapshotter,
                                                      SnapshotRegion* region);

// keel-launch only (the rank runs on a slot). `slot_ranks` says which ranks of `job` the slot
// holds when the fault fires (the worker's applied Membership: it changes with the job's
// layout); `ifname` is the slot's own network interface ("" : none, and a partition fault
// cannot cut it).
// `leader` says where the job's leader controller runs (nullopt: no etcd, or between two
// leaders), for controller_crash.
FaultInjector::SlotActions slot_fault_actions(const std::string& job,
                                              std::function<std::vector<int>()> slot_ranks,
                                              const std::string& ifname,
                                              std::function<std::optional<state::Leader>()> leader);

}  // namespace keel
