// One validation of a job's faults for every surface: keel-launch checks its --fault and
// --inject schedule at start, and the controller checks keel-ctl inject at run time, with
// the same function and so the same messages. Beyond validate_fault_plan's (values, ranks,
// steps, duplicates: robust/fault_spec.h) these are the checks that need the running job.
#pragma once

#include <functional>

#include "robust/fault_spec.h"

namespace keel {

struct FaultJob {
  int world = 1;
  int64_t steps = 0;                     // train.steps
  std::function<int(int rank)> slot_of;  // the rank's slot now (-1: a job without slots)
  bool own_interfaces = false;           // each slot on its own network interface (KEEL_IFNAME)
  // Slot 0 can be lost: its controller runs in a process of its own (--local), or a
  // candidate on another slot takes over (the job has etcd).
  bool slot0_losable = false;
  bool failover = false;  // the job has etcd and controller candidates (controller_crash)
};

// Throws keel::InputError naming the fault and what is wrong when the job cannot run a fault
// of `plan`: validate_fault_plan's checks over the whole plan (so a fault given twice is
// refused), then, for the faults from index `first_new` on, what the job must offer: a slot
// (slot 0 only where it can be lost) for slot_loss and partition, a network interface per
// slot for partition, failover for controller_crash, and, at run time (first_new > 0 or `running`),
// no sdc fault (it is installed on every rank when the job starts).
void check_faults(const FaultPlan& plan, const FaultJob& job, int first_new, bool running);

}  // namespace keel
