// The controller's view of the slots (keel-launch): a RankHost whose ranks run on agents,
// one per slot, reached over the control plane. Ranks are laid on slots in Megatron order,
// `workers_per_slot` consecutive ranks a slot, so a TP group stays inside a slot where it
// fits. A slot whose heartbeats stop for detect.slot_timeout_ms is lost, with all its ranks;
// it is active again once its agent registers anew.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "launcher/rank_host.h"

namespace keel {

class ControlServer;

class AgentHost : public RankHost {
 public:
  // `worker_argv`: keel-worker's command line (program first); `slots`: slots that run
  // ranks (0 .. slots-1).
  AgentHost(ControlServer* server, int world, int workers_per_slot, int slots,
            std::vector<std::string> worker_argv, std::chrono::milliseconds slot_timeout);

  // Messages of agents (the controller passes them on); `pump` handles the control plane's
  // pending messages (the controller's), for the calls here that wait on an agent.
  void on_message(const std::string& identity, const control::Envelope& msg);
  void set_pump(std::function<void()> pump) { pump_ = std::move(pump); }
  void set_epoch(int epoch) { epoch_ = epoch; }

  // Waits until every slot has registered (or `timeout` passes: false).
  bool wait_for_slots(std::chrono::milliseconds timeout, const volatile int* stop);

  void spawn(int rank, const std::map<std::string, std::string>& env) override;
  void kill(int rank) override;
  std::optional<RankExit> poll_exit() override;
  void stop_all(int sig, std::chrono::milliseconds grace) override;
  std::map<int, std::set<int64_t>> survey(const Topology& topo) override;
  void finish() override;
  int slot_of(int rank) const override { return rank / workers_per_slot_; }
  bool can_spawn(int rank) const override;
  void fill_status(control::StatusReply* reply) const override;

  // Slots that are lost now.
  std::vector<int> lost_slots() const;

 private:
  enum class State { kPending, kActive, kLost };
  struct Slot {
    std::string identity, host;
    State state = State::kPending;
    std::chrono::steady_clock::time_point last_heartbeat;
    int pid = 0;
  };
  void send(int slot, const control::Envelope& msg);
  void check_heartbeats();

  ControlServer* server_;
  int world_, workers_per_slot_;
  std::vector<Slot> slots_;
  std::vector<std::string> worker_argv_;
  std::chrono::milliseconds slot_timeout_;
  std::function<void()> pump_;
  int epoch_ = 0;
  std::vector<bool> alive_;  // rank has a running worker as far as we know
  std::set<int> killing_;    // ranks whose exit we caused (not reported)
  std::deque<RankExit> exits_;
  std::map<int, control::Event> survey_replies_;  // slot -> snapshots event
};

}  // namespace keel
