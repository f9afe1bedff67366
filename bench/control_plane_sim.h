// keel-bench control-plane: the job's control plane at scale, by simulation (bench/RESULTS.md
// records its output). For each size it stands up a real etcd (one member on loopback ports of
// its own, data under /dev/shm, removed at the end), the real controller (keel-launch
// --candidate: it wins the job's election and takes the job over from what etcd holds, as a
// new leader does) and thousands of fake agents and ranks (bench/control_plane_fakes.h) that
// speak the real protocol with no training, and measures:
//   - the controller's CPU seconds per second in steady state (/proc/<pid>/stat), with every
//     rank reporting progress and every agent heartbeating at the real rates;
//   - how long the agents' registration with the new leader takes (its `takeover` event);
//   - a slot's loss (its fake agent's and workers' sockets closed, as a dead machine's are):
//     the time to the controller's `slot_lost` event and to the Rebuild of the next epoch in
//     the store, and etcd's writes, bytes written and reads over the whole recovery (etcd's
//     own /metrics), of which the controller's writes (its `recovered` event);
//   - with `failover`, a leader failover: a second candidate waits in line from the start, the
//     leader is SIGKILLed after the recovery, and the time from the kill until every agent is
//     welcomed by the new leader.
#pragma once

#include <string>
#include <vector>

#include "bench/scenarios.h"

namespace keel::bench {

struct ControlPlaneOptions {
  std::vector<int> ranks = {64, 256, 1024, 4096, 16384};  // the ladder of sizes
  int per_slot = 8;                                       // ranks a slot
  int standby = 1;                                        // standby slots
  int heartbeat_ms = 200;                                 // an agent's period
  int progress_ms = 200;                                  // a rank's progress period
  int step_ms = 1000;                                     // a fake step
  double steady_s = 5;                                    // the CPU window
  // detect.slot_timeout_ms of the simulated job (0: the config's, 2000): also how long a new
  // leader waits for every agent to register before it takes the silent ones as lost.
  int slot_timeout_ms = 0;
  bool failover = false;
  std::string keel_launch;  // the controller's binary (keel-launch)
  std::string config;       // a job config (the model is never built; its layout is set here)
  std::string work_dir;     // where each size's run and etcd data go ("" : /dev/shm)
  bool quiet = false;       // no progress lines
};

// One size's figures; a figure not measured is -1.
struct ControlPlaneRow {
  int ranks = 0, slots = 0;
  double cpu_per_s = -1;        // controller CPU seconds per second, steady state
  double msgs_per_s = -1;       // control-plane messages the fakes sent per second, steady
  double ctl_kb_per_s = -1;     // kB per second the controller sent the fakes, steady
  double register_s = -1;       // every agent registered with the new leader (takeover event)
  double detect_s = -1;         // the slot's loss to the controller's slot_lost event
  double rebuild_s = -1;        // the slot's loss to rebuild/<E+1> in the store
  double etcd_writes = -1;      // puts etcd took over the recovery (loss to every restored)
  double etcd_bytes = -1;       // bytes of those puts' values and keys
  double etcd_reads = -1;       // ranges etcd served over the recovery
  double ctl_etcd_writes = -1;  // of the writes, the controller's (its `recovered` event)
  double failover_s = -1;       // leader SIGKILLed to every agent welcomed by the next
  bool rebuild_ok = false;      // the Rebuild moved the lost slot's ranks to the standby
  int incidents = 0;            // `recovered` events: 1 expected (more: a false detection)
  std::string error;            // why the size could not be measured ("" : it was)
};

// Runs one size (`ranks`, a multiple of per_slot). Never throws for what the run met: a size
// that fails says why in `error`.
ControlPlaneRow run_control_plane_size(const ControlPlaneOptions& o, int ranks);

// keel-bench control-plane: the ladder, a row per size, with each figure's growth against the
// smallest size and the figures that grow faster than the ranks flagged.
Command add_control_plane_command(CLI::App& app);

}  // namespace keel::bench
