#include "launcher/worker/fault_actions.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/check.h"

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

FaultInjector::SlotActions slot_fault_actions(const std::string& job) {
  FaultInjector::SlotActions act;
  act.kill_slot = [job] {
    // The machine is gone with everything on it: the shared memory of the slot's ranks
    // (their snapshots and the backups they held), its launcher, its workers.
    const char* env = std::getenv("KEEL_SLOT_RANKS");
    const std::string ranks = env ? env : "";
    for (size_t at = 0; at < ranks.size();) {
      const size_t comma = ranks.find(',', at);
      const int r = std::stoi(ranks.substr(at, comma - at));
      shm_unlink(snapshot_segment_name(job, r).c_str());
      shm_unlink(backup_segment_name(job, r).c_str());
      at = comma == std::string::npos ? ranks.size() : comma + 1;
    }
    std::fflush(nullptr);
    ::kill(getppid(), SIGKILL);  // the slot's keel-launch; its workers die with it
    raise(SIGKILL);
  };
  act.cut_network = [] {
    const char* ifname = std::getenv("KEEL_IFNAME");
    if (!ifname || !*ifname)
      throw InputError(
          "a partition fault needs the slot on its own network interface (KEEL_IFNAME)");
    const std::string cmd = std::string("ip link set dev ") + ifname + " down";
    KEEL_CHECK(std::system(cmd.c_str()) == 0, "partition: '", cmd, "' failed");
  };
  return act;
}

}  // namespace keel
