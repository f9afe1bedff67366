// Keeps the job's etcd at strength as machines come and go (DESIGN.md, Control state and
// failover): a member whose slot is lost is removed from the cluster and a new one is added
// and started on a live slot that runs none (Raft reconfiguration, one member at a time,
// while the other members hold quorum). Without it, a job of 3 members that loses two of its
// first three slots over its life, one at a time, would lose quorum although each loss alone
// was survivable. Runs in the controller's loop (slot 0's keel-launch).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "launcher/controller/event_fields.h"
#include "launcher/etcd/etcd_client.h"

namespace keel {

class AgentHost;

class EtcdUpkeep {
 public:
  // The members keel started, one per slot 0..members-1 (named slot<k>); `on_event` records
  // each replacement in the job's event log.
  EtcdUpkeep(AgentHost* agents, EtcdClient* client, int members, std::string data_root,
             std::string log_dir,
             std::function<void(const std::string&, const EventFields&)> on_event);

  // Replaces the member of one lost slot, if any: at most one change a call, so that each
  // runs on a cluster that has taken the one before. A change that fails is tried again at
  // a later call (etcd without quorum cannot change its members).
  void maintain();

  // Members replaced so far.
  int replaced() const { return replaced_; }

 private:
  AgentHost* agents_;
  EtcdClient* client_;
  const std::string data_root_, log_dir_;
  std::function<void(const std::string&, const EventFields&)> on_event_;
  struct Member {
    std::string name, peer_url;
  };
  std::map<int, Member> members_;  // slot -> the member keel started there
  int replaced_ = 0;
};

}  // namespace keel
