// The controller's view of the slots (keel-launch): a RankHost whose ranks run on agents,
// one per slot, reached over the control plane. Ranks start on slots in Megatron order,
// `workers_per_slot` consecutive ranks a slot, so a TP group stays inside a slot where it
// fits. A slot whose heartbeats stop for detect.slot_timeout_ms is lost, with its ranks.
//
// Standby slots (keel-launch --standby K, the last K) run parked workers that have passed a
// self-check (launcher/worker/standby.h). promote() moves a lost or evicted slot's ranks onto a
// ready standby; spawning such a rank then hands it to a parked worker instead of starting a
// process. An evicted or lost slot that registers again becomes a standby.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "launcher/controller/rank_host.h"
#include "parallel/store.h"

namespace keel {

class ControlServer;

class AgentHost : public RankHost {
 public:
  // `worker_argv`: keel-worker's command line (program first); `slots` in all, of which the
  // last `standby_slots` start as standbys; `store`: the job's store (standby handshakes).
  AgentHost(ControlServer* server, std::shared_ptr<Store> store, int world, int workers_per_slot,
            int slots, int standby_slots, std::vector<std::string> worker_argv,
            std::map<std::string, std::string> worker_env, std::chrono::milliseconds slot_timeout);

  // The job id every registering agent must present (Register.job); empty: any.
  void set_job(std::string job) { job_ = std::move(job); }

  // Messages of agents (the controller passes them on); `pump` handles the control plane's
  // pending messages (the controller's), for the calls here that wait on an agent.
  // A Register is refused (Command refuse, with the reason; the job goes on untouched) when
  // its job id is not this job's, its slot is outside 0..slots-1, it claims slot 0 from
  // another process than this one (slot 0 is the controller's own), or its slot is active
  // under another agent (a slot is free again once taken as lost: no heartbeat for the slot
  // timeout). Heartbeats of an agent that is not its slot's registered one are ignored.
  void on_message(const std::string& identity, const control::Envelope& msg);
  void set_pump(std::function<void()> pump) { pump_ = std::move(pump); }

  // Waits until every slot has registered (or `timeout` passes: false).
  bool wait_for_slots(std::chrono::milliseconds timeout, const volatile int* stop);

  void spawn(int rank, const std::map<std::string, std::string>& env) override;
  void kill(int rank) override;
  bool spawn_extra(int slot, int id, const std::map<std::string, std::string>& env) override;
  void kill_extra(int slot, int id) override;
  std::optional<RankExit> poll_exit() override;
  void stop_all(int sig, std::chrono::milliseconds grace) override;
  std::map<int, policy::Holdings> survey(const Topology& topo, bool replica_backups) override;
  void finish() override;
  int slot_of(int rank) const override { return rank_slot_[size_t(rank)]; }
  void fill_view(policy::ClusterView* view) const override;
  double slot_silence_s(int slot) const override;
  void fill_status(control::StatusReply* reply) const override;
  bool promote(int slot, int standby) override;
  void evict(int slot) override;
  std::vector<int> ranks_on(int slot) const override;
  void renumber(const std::map<int, int>& old_to_new, int new_world) override;
  bool place(const std::vector<int>& ranks) override;
  // Asks every active slot's agent to capture its workers' stacks and waits for the answers
  // (pumping the control plane) up to `timeout` and a second for the trip. Each agent's
  // capture is held under half the slot timeout: it sends no heartbeat meanwhile.
  std::map<int, control::RankStacks> capture_stacks(std::chrono::milliseconds timeout) override;

 private:
  enum class State { kPending, kActive, kLost };
  enum class Role { kActive, kStandby, kEvicted };
  struct Slot {
    std::string identity, host;
    State state = State::kPending;
    Role role = Role::kActive;
    std::chrono::steady_clock::time_point last_heartbeat;
    int pid = 0;
    // Per parked worker: "ok ..." / "failed ..." / "" (not known yet); filled in lazily from
    // the store, also when keel-ctl status asks.
    mutable std::vector<std::string> self_check;
    int gen = 0;                   // times it was made a standby
    int registrations = 0;         // Register messages received
    bool initial_standby = false;  // a standby from the start (checked together)
  };
  void send(int slot, const control::Envelope& msg);
  // Why a Register from `identity` cannot be taken ("" if it can).
  std::string refusal(const std::string& identity, const control::Register& reg) const;
  void check_heartbeats();
  void start_standby(int slot, bool initial);
  bool standby_ready(int slot) const;

  ControlServer* server_;
  std::shared_ptr<Store> store_;
  std::string job_;
  int world_, workers_per_slot_;
  std::vector<Slot> slots_;
  std::vector<std::string> worker_argv_;
  std::map<std::string, std::string> worker_env_;  // for standby workers (no rank yet)
  std::chrono::milliseconds slot_timeout_;
  std::function<void()> pump_;
  std::vector<int> rank_slot_;
  std::map<int, int> adopt_;  // rank -> parked worker index on its (new) slot
  int initial_standbys_ = 0;
  std::vector<bool> alive_;  // rank has a running worker as far as we know
  std::set<int> killing_;    // ranks whose exit we caused (not reported)
  std::deque<RankExit> exits_;
  std::map<int, control::Event> survey_replies_;  // slot -> snapshots event
  std::map<int, control::Event> stacks_replies_;  // slot -> stacks event
};

}  // namespace keel
