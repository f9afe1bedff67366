// What the faults that act on a rank's surroundings do in keel-worker: to its snapshot
// (corrupt_snapshot, lose_snapshot) and to its slot (slot_loss, partition). The injector
// (robust/fault_injector.h) decides when; these say how, with the worker's own objects.
#pragma once

#include <string>

#include "ckpt/snapshot_region.h"
#include "ckpt/snapshotter.h"
#include "robust/fault_injector.h"

namespace keel {

// Both borrow: they must outlive the actions.
FaultInjector::SnapshotActions snapshot_fault_actions(Snapshotter* snapshotter,
                                                      SnapshotRegion* region);

// keel-launch only (KEEL_SLOT, KEEL_SLOT_RANKS, KEEL_IFNAME in the environment).
FaultInjector::SlotActions slot_fault_actions(const std::string& job);

}  // namespace keel
