#include "launcher/worker/fault_actions.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>  // std::system
#include <vector>

#include "launcher/control_plane.h"
#include "parallel/net_address.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {

FaultInjector::SnapshotActions snapshot_fault_actions(Snapshotter* snapshotter,
                                                      SnapshotRegion* region) {
  FaultInjector::SnapshotActions act;
  act.corrupt_newest = [snapshotter, region] {
    snapshotter->wait_idle();
    std::vector<int64_t> steps = region->valid_steps();
    if (!steps.empty())
      corrupt_snapshot_slot(region->name(), *std::max_element(steps.begin(), steps.end()));
  };
  act.remove = [snapshotter, region] {
    snapshotter->wait_idle();
    shm_unlink(region->name().c_str());
  };
  return act;
}

FaultInjector::SlotActions slot_fault_actions(
    const std::string& job, std::function<std::vector<int>()> slot_ranks, const std::string& ifname,
    std::function<std::optional<state::Leader>()> leader) {
  FaultInjector::SlotActions act;
  act.kill_slot = [job, slot_ranks = std::move(slot_ranks)] {
    // The machine is gone with everything on it: the shared memory of the slot's ranks
    // (their snapshots and the backups they held), its launcher, its workers.
    for (const int r : slot_ranks()) {
      shm_unlink(snapshot_segment_name(job, r).c_str());
      shm_unlink(backup_segment_name(job, r).c_str());
    }
    std::fflush(nullptr);
    ::kill(getppid(), SIGKILL);  // the slot's keel-launch; its workers die with it
    raise(SIGKILL);
  };
  act.cut_network = [ifname] {
    if (ifname.empty())
      throw InputError(
          "a partition fault needs the slot on its own network interface (KEEL_IFNAME)");
    const std::string cmd = "ip link set dev " + ifname + " down";
    KEEL_CHECK(std::system(cmd.c_str()) == 0, "partition: '", cmd, "' failed");
  };
  act.kill_controller = [leader = std::move(leader)] {
    const std::optional<state::Leader> l = leader ? leader() : std::nullopt;
    if (!l || l->pid() <= 0) {
      LOG(ERROR) << "controller_crash: no leader controller known (the job has no etcd, or "
                    "is between two leaders): nothing killed";
      return;
    }
    // A PID names a process of this machine only: the fault is for jobs whose controller
    // runs beside this rank (--local, or the rank on the leader's slot).
    const std::string host = endpoint_host(l->endpoint());
    bool here = host.rfind("127.", 0) == 0;
    for (const auto& [ifname, addr] : ipv4_interfaces()) here = here || addr == host;
    if (!here) {
      LOG(ERROR) << "controller_crash: the leader runs on " << host
                 << ", not on this machine: nothing killed";
      return;
    }
    LOG(WARNING) << "controller_crash: SIGKILL to the leader controller (pid " << l->pid()
                 << ", slot " << l->slot() << ")";
    ::kill(l->pid(), SIGKILL);
  };
  return act;
}

}  // namespace keel
