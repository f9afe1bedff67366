// The job's etcd, as slot 0's keel-launch sets it up once every slot has registered
// (DESIGN.md, Control state and failover): members started beside the first 3 (or 5) slots
// by their agents (or the user's cluster, --etcd), a client over them, the leadership won and
// the job spec written. A job of 1-2 slots has none: nothing to fail over to.
#pragma once

#include <chrono>
#include <csignal>
#include <memory>
#include <string>

#include "launcher/controller/etcd_control_state.h"
#include "launcher/controller/etcd_upkeep.h"
#include "launcher/etcd/etcd_client.h"
#include "launcher/timings.h"

namespace keel {

class AgentHost;

// The leader's lease, in etcd's whole seconds (launcher/timings.h says why 5 s).
inline constexpr std::chrono::seconds kControllerLeaseTtl =
    std::chrono::duration_cast<std::chrono::seconds>(timings::kControllerLease);

struct JobEtcdOptions {
  int slots = 0;          // the job's slots (members start with 3 or more)
  int members = 0;        // --etcd-members (0: by the job's size, etcd_member_count)
  std::string endpoints;  // --etcd: the user's cluster ("" : start members)
  std::string data_root;  // members' data: DATA_ROOT/slot<k>
  std::string log_dir;    // members' logs: LOG_DIR/etcd-slot<k>.log
  std::chrono::milliseconds quorum_timeout{60000};  // detect.quorum_timeout_ms
  state::Leader leader;                             // this controller
  state::JobSpec spec;                              // written once the leadership is won
  const volatile sig_atomic_t* stop = nullptr;      // set by SIGINT/SIGTERM: give up waiting
};

struct JobEtcd {
  std::unique_ptr<EtcdClient> client;
  std::unique_ptr<EtcdControlState> state;
  std::unique_ptr<EtcdUpkeep> upkeep;  // null with the user's cluster (--etcd): theirs to keep
  // The job's store in this etcd (launcher/etcd/etcd_store.h), as the spec records it.
  std::string store_addr;
  int candidates = 0;  // the slots that run a controller candidate: 0..candidates-1
  // For the console, once: where etcd runs and what its start cost, e.g. "etcd: 5 members on
  // slots 0,1,2,3,4 (127.0.0.1:40101,...; a quorum survives two lost machines), up and led
  // in 1.42 s".
  std::string summary;
};

// Sets the job's etcd up as the header says; an empty JobEtcd for a job of 1-2 slots without
// --etcd. Throws keel::Error (a member that would not start, no quorum within the quorum
// timeout) naming what failed.
JobEtcd start_job_etcd(AgentHost& agents, const JobEtcdOptions& o,
                       std::function<void(const std::string&, const EventFields&)> on_event);

}  // namespace keel
