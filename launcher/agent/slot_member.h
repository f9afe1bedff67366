// A slot's etcd member as its agent keeps it (DESIGN.md, Control state and failover): on the
// two ports the slot registered with, started when the leader says (Command etcd_start), and
// started again from its own data when its process ends while the slot lives, so that the
// cluster is whole again within a second without a membership change (the leader's upkeep
// replaces members of lost slots only) and a second member lost later does not cost the
// quorum. One that keeps ending is left to the upkeep. Runs in every keel-launch, on its
// agent's thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "launcher/etcd/etcd_members.h"
#include "proto/control.pb.h"

namespace keel {

class SlotMember {
 public:
  // Picks the member's client and peer ports on `host` now: a member is started with the
  // whole cluster named, so every member's ports must be known before any starts.
  SlotMember(int slot, std::string host, std::string job);

  int client_port() const { return ports_[0]; }
  int peer_port() const { return ports_[1]; }

  // Command etcd_start: starts the member `m` names, unless it runs (a member this slot ran
  // before, that ended while the slot was lost, is replaced by a new one). Returns its pid;
  // throws keel::Error if it cannot be started.
  pid_t start(const control::EtcdMemberStart& m);
  // Every pass of the agent's loop: starts the member again from its data if its process
  // ended (at most once a second; not after it ended within seconds three times running).
  void keep();

 private:
  static constexpr std::chrono::milliseconds kRestartEvery{1000};

  const int slot_;
  const std::string host_, job_;
  int ports_[2] = {0, 0};
  std::unique_ptr<EtcdMember> member_;
  std::chrono::steady_clock::time_point started_{};
  int quick_ends_ = 0;
  bool given_up_ = false;
};

}  // namespace keel
