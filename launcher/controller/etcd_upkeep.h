// Keeps the job's etcd at strength as machines come and go (DESIGN.md, Control state and
// failover): a member whose slot is lost is removed from the cluster and a new one is added
// and started on a live slot that runs none, in the failure domain with the fewest members;
// so is one whose slot came back under a new agent (orphaned)
// (robust/etcd_member_place.h; Raft reconfiguration, one member at a time,
// while the other members hold quorum). Without it, a job of 3 members that loses two of its
// first three slots over its life, one at a time, would lose quorum although each loss alone
// was survivable. A member cut off by a partition is removed only some seconds after its
// slot went silent (why: kCutOffMemberGrace in the .cc). It also keeps etcd's Raft leader
// in one known place, moving it only while the cluster is whole and settled
// (robust/raft_leader_place.h says where and when). Runs in the leader's loop.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launcher/controller/event_fields.h"
#include "launcher/etcd/etcd_client.h"
#include "proto/control_state.pb.h"

namespace keel {

class AgentHost;

class EtcdUpkeep {
 public:
  // Keeps `members` (as the control state records them); `record` writes each change there
  // (fenced on the leadership: a leader that takes over keeps them from where this one left
  // them), `on_event` records each replacement and each move of the Raft leader in the job's
  // event log. `controller_slot`: this controller's machine (under --local, where the
  // launcher stands beside every slot: the slot whose candidate leads).
  EtcdUpkeep(AgentHost* agents, EtcdClient* client, state::EtcdMembers members,
             std::function<void(const state::EtcdMembers&)> record,
             std::function<void(const std::string&, const EventFields&)> on_event,
             int controller_slot);

  // The record of the members keel starts on `slots` (named slot<k>).
  static state::EtcdMembers first(const AgentHost& agents, const std::vector<int>& slots,
                                  const std::string& data_root, const std::string& log_dir);

  // Replaces the member of one lost slot, if any: at most one change a call, so that each
  // runs on a cluster that has taken the one before. A change that fails is tried again at
  // a later call (etcd without quorum cannot change its members). The loop is held only for
  // etcd's own calls (the removal and the add, milliseconds with a quorum): the new member's
  // agent starts it while the loop goes on, and later calls follow it until etcd lists every
  // member started (event `etcd_whole`), before any next change.
  void maintain();

  // Moves etcd's Raft leader home (robust/raft_leader_place.h) when it leads elsewhere and
  // the move is safe: checked every few seconds, and only once the members have not changed
  // for a while (a member just added may still be catching up). One Status per member a
  // check, all at once, with a short deadline. Runs in maintain().
  void keep_raft_leader_home();

  // Throws QuorumLost, naming the members and the way out, when the members left cannot form
  // a quorum and the others are known dead: their slots lost with their agents' connections
  // closed (not silent: a cut-off machine may come back) and their peer ports refusing. Else
  // returns, and the caller waits for etcd as before (detect.quorum_timeout_ms). Probes at
  // most every kQuorumCheckEvery (the .cc).
  void check_quorum();

  // Members replaced so far.
  int replaced() const { return members_.replaced(); }

 private:
  // The member on `slot`, if any.
  const state::EtcdMembers::Member* on(int slot) const;
  bool orphaned(const state::EtcdMembers::Member& m) const;
  // Whether `m`'s slot is up under an agent that did not start it: its machine was lost and
  // came back (a repair, a reboot: `keel-launch --join` again), and the new agent, with ports
  // of its own, runs no member. Replaced as a lost slot's member is, on that slot if it is
  // the best place.
  // A replacement under way (maintain): its agent's answer, then every member started.
  void follow_start();

  struct Starting {
    int slot = -1;     // where the new member starts
    std::string name;  // its name
    std::chrono::steady_clock::time_point sent_at, changed_at, checked_at;
  };

  AgentHost* agents_;
  EtcdClient* client_;
  state::EtcdMembers members_;
  std::function<void(const state::EtcdMembers&)> record_;
  std::function<void(const std::string&, const EventFields&)> on_event_;
  std::chrono::steady_clock::time_point probed_at_;            // the last probe of a silent member
  std::chrono::steady_clock::time_point quorum_checked_at_{};  // check_quorum's last probes
  int controller_slot_;
  // Since when the members are as they are (this controller's start, or the last change),
  // and the last look at the Raft leader's place.
  std::chrono::steady_clock::time_point changed_at_;
  std::chrono::steady_clock::time_point leader_checked_at_{};
  std::string leader_stays_because_;  // said once until it changes
  std::optional<Starting> starting_;  // a replacement whose member is not yet running
};

}  // namespace keel
