// keel-bench --soak N: one job through N mixed faults, checked for what a long job must not
// lose. It runs the job fault-free once for reference, then once under a schedule of N faults
// (crash, exit, the hang kinds, NaN loss, corrupt and lost snapshots, lost slots, and where
// network namespaces can be made, partitions), bringing every lost slot back with
// `keel-launch --join` as the job runs, so that standbys are there for the next fault. A
// partition needs machines with links of their own: with namespaces each slot is one
// (tests/integration/netns.h), slot 0's launcher with the controller in the first, and a
// partitioned machine is repaired (its processes killed, its memory emptied, its link up)
// before it joins again. At the end it checks:
//   - every step was done, and the final parameters are bitwise equal to the reference's;
//   - every fault became an incident the job recovered from, and every time the soak killed
//     the leader controller from outside (every --soak-kill-controller-every seconds) a
//     candidate took the job over;
//   - no process of the job and no shared-memory segment of it is left;
//   - the resident memory of every long-lived process (alive through half the run at least)
//     stayed flat from the second quarter of its life to its last.
// It writes DIR/soak.json (proto/bench.proto SoakReport), DIR/soak-schedule.pbtxt (to repeat
// it with keel-launch --inject) and DIR/soak-rss.svg, and exits 0 only if every check passed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/faults.pb.h"

namespace keel::bench {

// Where the slots run: kLocal, all on this machine's loopback (keel-launch --local; no
// partitions); kNetns, one network namespace each (partitions in the mix); kAuto, kNetns
// when namespaces can be made here (root and iproute2), else kLocal.
enum class SoakMachines { kAuto, kLocal, kNetns };

struct SoakOptions {
  std::string config;             // the job (its train.steps is replaced)
  std::vector<std::string> sets;  // --set overrides, passed to both runs
  std::string out;                // DIR
  int faults = 100;
  int local = 0;  // slots; 0: world / workers_per_slot + standby
  int standby = 2;
  int workers_per_slot = 2;
  int gap_steps = 4;  // steps between two faults
  uint64_t seed = 1;
  SoakMachines machines = SoakMachines::kAuto;
  // The leader controller killed -9 from outside this often (the PID the election names),
  // each time once the previous kill was taken over; 0: never.
  double kill_controller_every_s = 0;
  // A cluster of its own on the host for the job's etcd (--etcd), or, without (the default),
  // the members keel-launch starts on the job's own slots, lost and replaced with the
  // machines.
  bool own_etcd = false;
};

// The soak's faults: `faults` of them, one every `gap` steps from `first_step`, kinds in a
// fixed mix (shuffled by `seed`, so every kind comes round evenly; with `partitions`, the
// mix has partition too), ranks drawn uniformly: slot 0's machine is lost or cut off like
// any other (in namespaces it runs `keel-launch --slots` and the first controller; the soak
// then has the job's end from etcd). The same arguments give the same schedule.
faults::FaultSchedule soak_schedule(int faults, int64_t first_step, int gap, int world,
                                    uint64_t seed, bool partitions);

// Runs the soak; 0 when every check passed, 1 when one failed, 2 on bad input.
int soak_main(const SoakOptions& o);

}  // namespace keel::bench
