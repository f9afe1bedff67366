// The agent of one slot (machine), inside every keel-launch process: registers with the
// controller, heartbeats, starts and kills the slot's workers when told, reports each
// worker's exit (code or signal, with the last lines of its log), answers surveys of the
// snapshots its shared memory holds, and at shutdown removes that shared memory (the
// workers' own snapshots and the backups the slot held for others). The controller answers
// every heartbeat; an agent that hears nothing from it for `controller_timeout` stops its
// workers, removes that shared memory and exits with kExitControllerLost, so nothing
// lingers when slot 0 dies (the job is then restarted with keel-launch --resume).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <string>

#include <sys/types.h>

#include "parallel/topology.h"

namespace keel {

struct AgentOptions {
  int slot = 0;
  int workers = 1;               // worker capacity of the slot
  std::string host;              // the slot's reachable address, for the controller
  std::string controller;        // the control plane's endpoint
  std::string log_dir;           // each worker's stdout and stderr: log_dir/rank<R>.log
  Topology topo{1, 1, 1};        // to know whose backups the slot holds
  bool replica_backups = false;  // DP replicas are each other's backups (replicas_hold_backups)
  std::string job;               // names the job's shared memory
  std::chrono::milliseconds register_timeout{std::chrono::seconds(10)};
  // detect.controller_timeout_ms: silence from the controller, once it welcomed the agent,
  // after which the slot is stopped (0: never).
  std::chrono::milliseconds controller_timeout{std::chrono::seconds(10)};
};

// Agent::run's result (and the joined keel-launch's exit status) when the controller went
// silent: the slot stopped its workers and removed its shared memory. 75 is sysexits.h's
// EX_TEMPFAIL: nothing is wrong with the slot; the job can be resumed (--resume).
constexpr int kExitControllerLost = 75;
// Agent::run's result when the controller refused the registration (a wrong job id, a slot
// out of range, in use, or slot 0): bad input, as recovery::kExitInputError.
constexpr int kExitJoinRefused = 2;

class Agent {
 public:
  explicit Agent(AgentOptions o) : o_(std::move(o)) {}
  // Runs until the controller says shutdown (0), the controller cannot be reached at the
  // start (1), refuses the registration (kExitJoinRefused, the reason said on stderr), the
  // controller is silent for controller_timeout (kExitControllerLost), or
  // `stop` is set (from another thread or a signal handler; 0, and if the controller's
  // process is gone, the job's shared memory on this machine is removed too).
  int run(const volatile int* stop = nullptr);

 private:
  AgentOptions o_;
  std::map<int, pid_t> workers_;  // rank -> pid
  std::map<int, pid_t> parked_;   // standby index -> pid of a worker waiting for a rank
  std::set<int> hosted_;          // every rank this slot ran (its shared memory is here)

  void kill_workers();          // SIGKILLs and reaps every worker, parked ones included
  void remove_shared_memory();  // the segments of every rank in hosted_
  int stop_without_controller(std::chrono::milliseconds silent);
};

}  // namespace keel
