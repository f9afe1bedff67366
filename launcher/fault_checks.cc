#include "launcher/fault_checks.h"

#include <string>

#include "runtime/check.h"

namespace keel {

void check_faults(const FaultPlan& plan, const FaultJob& job, int first_new, bool running) {
  validate_fault_plan(plan, job.world, job.steps);
  for (int i = first_new; i < plan.schedule.fault_size(); ++i) {
    const faults::Fault& f = plan.schedule.fault(i);
    const std::string name =
        detail::concat(fault_kind_name(f.kind()), "@step=", f.step(), ",rank=", f.rank());
    // The hook that corrupts a rank's tensors is installed on every rank alike when the job
    // starts (it changes when a single micro-batch's gradients are reduced), not later.
    if (running && f.kind() == faults::Fault::sdc)
      throw InputError(name +
                       ": sdc faults are given when the job starts (--fault or --inject), not "
                       "while it runs");
    if (f.kind() == faults::Fault::controller_crash && !job.failover)
      throw InputError(name +
                       ": a controller crash needs a job whose controller can fail over: "
                       "keel-launch --local or --slots with 3 or more slots (or --etcd), "
                       "not mpirun or keel-worker --nproc");
    const bool slot_fault =
        f.kind() == faults::Fault::slot_loss || f.kind() == faults::Fault::partition;
    if (!slot_fault) continue;
    const int slot = job.slot_of ? job.slot_of(f.rank()) : -1;
    if (slot < 0)
      throw InputError(detail::concat(name, ": rank ", f.rank(),
                                      " has no slot (slots are keel-launch's: run the job "
                                      "with keel-launch, not keel-worker --nproc)"));
    if (slot == 0 && !job.slot0_losable)
      throw InputError(detail::concat(name, ": rank ", f.rank(),
                                      " is on slot 0, which hosts the controller and cannot be "
                                      "lost without etcd (a job of 3 or more slots, or --etcd); "
                                      "pick a rank of another slot"));
    if (f.kind() == faults::Fault::partition && !job.own_interfaces)
      throw InputError(name +
                       ": a partition fault needs each slot on its own network interface, named "
                       "by KEEL_IFNAME (e.g. machines as network namespaces); under --local "
                       "every slot shares loopback");
  }
}

}  // namespace keel
