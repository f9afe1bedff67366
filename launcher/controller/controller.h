// The job's controller: the one owner of the job's membership (launcher/controller/
// membership.h), failure detection and the recovery decisions' carrying out (DESIGN.md,
// Failure handling and Recovery protocol). It starts every rank through a RankHost, watches
// their exits, the communication errors they report through the store, their progress (a
// rank that stops while the others wait inside a collective is hung), their speed (fail-slow)
// and, under keel-launch, whole slots; and on a failure it moves the job to the next epoch,
// writing rebuild/<E> (every epoch's, epoch 0's included, carries the Membership):
//   recovery.mode = in_place     the failed ranks are restarted alone, the others rebuild
//                                their communicators and every rank restores the newest
//                                step that all of them can restore;
//   recovery.mode = restart_all  every rank is stopped and the job restarts from its newest
//                                persistent checkpoint.
// Its parts (controller_impl.h) each own their state: the Detector, the epoch transition
// (controller_recovery.cc), the UpdateManager, the ReplayCoordinator, the
// DiagnoseCoordinator and the SlowWatcher. The decisions themselves are robust/'s.
// Used by keel-worker --nproc (ranks forked locally) and keel-launch (ranks on agents).
#pragma once

#include <signal.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "launcher/controller/event_fields.h"
#include "launcher/controller/rank_host.h"
#include "parallel/store.h"
#include "parallel/topology.h"
#include "proto/config.pb.h"
#include "proto/control.pb.h"
#include "proto/control_state.pb.h"
#include "proto/faults.pb.h"
#include "proto/membership.pb.h"
#include "proto/report.pb.h"

namespace keel {

class ControlServer;
class EtcdControlState;
class EtcdUpkeep;

struct ControllerOptions {
  config::JobConfig cfg;
  std::string job;                  // names the job's shared memory and run directory
  std::string lineage;              // of its persistent checkpoints (ckpt/persistent_checkpoint.h):
                                    // the job, or the checkpoint it resumed from
  double job_start = 0;             // unix seconds (ETTR counts from here)
  std::string store_addr;           // host:port of the rendezvous store the ranks meet through
  std::string controller_endpoint;  // the control plane's endpoint ("" under --nproc)
  std::string etcd_endpoints;       // the job's etcd, "host:port,..." ("" : none): the ranks
                                    // follow the leadership there (launcher/etcd/leader_link.h)
  std::string run_dir;              // runs/<job>: stacks go to run_dir/stacks/<name>/
                                    // ("" : a temporary directory)
  std::string report_path;          // --report: written here when keel stops the job itself
                                    // (rank 0 writes it at the job's end; "" : none)
  faults::FaultSchedule faults;     // the job's --fault/--inject schedule: keel-ctl inject
                                    // refuses a fault the job already has
  // The job's control state in etcd, borrowed (null: a job without etcd, of 1-2 slots or
  // under keel-worker --nproc): every Membership, incident, update, plugin and keel-ctl
  // command goes there too (launcher/controller/etcd_control_state.h).
  EtcdControlState* state = nullptr;
  EtcdUpkeep* upkeep =
      nullptr;  // keeps its members at strength (launcher/controller/etcd_upkeep.h)
  // A new leader (failover): the job's record as the previous one last wrote it to etcd (its
  // Membership, the decisions' memory, the update, the command log's progress). run() then
  // starts no rank: it waits for the agents to register again with their workers running,
  // takes a slot that does not as lost, carries out the commands left pending, and carries on
  // (launcher/controller/takeover.cc).
  std::optional<state::JobState> takeover;
  // Slot 0's agent runs in a process of its own (keel-launch --local): losing it loses no
  // controller, so keel-ctl inject may lose it.
  bool slot0_losable = false;
  // The slot whose agent runs in keel-launch's own process (slot 0 under --slots and mpirun):
  // never evicted, since ranks moved back onto it later would share the fate of keel-launch.
  // -1: none (--local forks slot 0's agent like any other).
  int controller_slot = -1;
  bool console_progress = false;  // print rank 0's progress every train.log_every steps
  const volatile sig_atomic_t* stop_signal = nullptr;  // set by SIGINT/SIGTERM handlers
  // Called for every event worth a line in the job's event log (launcher/controller/event_log.h).
  std::function<void(const std::string& kind, const EventFields& fields)> on_event;
};

class Controller {
 public:
  // `store` is a client of the job's store; `server` (may be null) receives the ranks'
  // progress and keel-ctl's requests; messages of agents are passed to `on_agent_message`.
  Controller(ControllerOptions opts, RankHost* host, std::shared_ptr<Store> store,
             ControlServer* server = nullptr);
  ~Controller();

  // Every message the controller does not handle itself (agents' registers, heartbeats and
  // events) goes here, on the controller's thread.
  void set_agent_handler(
      std::function<void(const std::string& identity, const control::Envelope& msg)> fn);

  // Starts every rank and runs the job to its end. Returns the process exit code (etcd
  // without quorum for detect.quorum_timeout_ms stops the job: recovery::kExitStopped).
  int run();

  // Handles the control-plane messages that have arrived (progress, keel-ctl, agents): for
  // a RankHost that waits on its agents outside run()'s loop.
  void pump();

  int epoch() const;

  // The job's control state in etcd and the upkeep of its members, once they are set up
  // (after every slot registered: its members run on the first slots); borrowed. Before run().
  void set_control_state(EtcdControlState* state, EtcdUpkeep* upkeep);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel
