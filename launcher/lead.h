// keel-launch's controller process (DESIGN.md, Control state and failover): the job's first
// leader, which keel-launch starts, and a slot's controller candidate, which the slot's agent
// starts once the job's etcd is up and which leads the job when the leader dies. Either one
// runs the job's Controller over its AgentHost; they differ in how they begin: the first
// starts the slots' etcd members and every rank, a candidate wins the election and takes the
// job over from what etcd holds while its ranks train on.
#pragma once

#include <signal.h>

#include <functional>
#include <string>
#include <vector>

#include "launcher/launch_options.h"
#include "proto/config.pb.h"
#include "proto/control_state.pb.h"

namespace keel {

// What the first leader is given by keel-launch.
struct FirstLead {
  LaunchOptions o;          // the etcd flags, --quiet
  config::JobConfig cfg;    // the job's config, overrides applied
  state::JobSpec spec;      // the job as etcd will record it (store_addr filled in here)
  std::string host;         // where its control plane (and a TCP store) listen
  bool fork_slots = false;  // --local: every slot on this machine
  int slot0_pid = 0;        // under mpirun slot 0's agent runs in this very process: its pid
  const volatile sig_atomic_t* stop = nullptr;  // set by SIGINT/SIGTERM/SIGHUP
  // Called once the control plane is bound (its endpoint), and once the job's etcd is up
  // (its endpoints; empty: the job has none): keel-launch starts the slots and learns where
  // a later leader will say how the job ended.
  std::function<void(const std::string& endpoint)> on_endpoint;
  std::function<void(const std::vector<std::string>& etcd)> on_etcd;
};

// Runs the job to its end as its first leader. Returns the job's exit status.
int lead_first(const FirstLead& f);

// keel-launch --candidate: campaigns in the job's etcd (o.etcd) until it leads or the job
// ends, then leads the job from what etcd holds. Returns the job's exit status as a leader,
// 0 when the job ended before this candidate led.
int lead_as_candidate(const LaunchOptions& o, const volatile sig_atomic_t* stop);

}  // namespace keel
