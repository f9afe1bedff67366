// The controller's transport to its slots (keel-launch): a RankHost whose ranks run on
// agents, one per slot, reached over the control plane. It keeps what only the transport
// knows (each agent's identity, pid and last heartbeat, the workers it runs, the parked
// standby workers' self-checks) and borrows the controller's JobMembership
// (launcher/controller/membership.h) for everything else: which slot a rank runs on, the
// slots' states, the layout. It reports its agents' news into that membership (a register,
// a slot whose heartbeats stopped for detect.slot_timeout_ms, a standby that checked itself);
// the epoch transition makes the other changes and tells it what to carry out.
//
// Standby slots (keel-launch --standby K, the last K) run parked workers that have passed a
// self-check (launcher/worker/standby.h). A rank promoted onto a standby is handed to a parked
// worker (adopt) instead of starting a process. An evicted or lost slot that registers again
// becomes a standby.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/controller/event_fields.h"
#include "launcher/controller/membership.h"
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
  // The job's store, once it is known (keel-launch learns it with its etcd, after the slots
  // registered), and what standby workers' environment gains with it (KEEL_STORE_ADDR,
  // KEEL_ETCD). Standbys that registered before are started now.
  void set_store(std::shared_ptr<Store> store, const std::map<std::string, std::string>& env);
  // The process slot 0's agent must register from (0: any): under mpirun it runs in the
  // controller's own process, and no other may claim it.
  void set_slot0_pid(int pid) { slot0_pid_ = pid; }
  // The job's etcd is up: every agent is told where (Command follow), to follow its
  // leadership, and `candidates` of them start a controller candidate: the first live slots,
  // whichever they are (keep_candidates). Agents that register later learn it with their
  // welcome.
  void follow(const std::vector<std::string>& etcd_endpoints, int candidates);
  // Keeps the job's candidates on live slots: when a slot that ran one is lost, the next
  // live slot is told to start one, so that losing the machines that ran them one after
  // another never leaves the job without a controller to fail over to.
  void keep_candidates() override;

  // Messages of agents (the controller passes them on). While a call here waits on an agent
  // it polls the control plane itself: the agents' messages it handles, every other one goes
  // to the controller's inbox (attach), so the controller is never re-entered. `pump` is for
  // a host driven without a controller (tests): it is called instead.
  // A Register is refused (Command refuse, with the reason; the job goes on untouched) when
  // its job id is not this job's, its slot is outside 0..slots-1, it claims slot 0 from
  // another process than this one (slot 0 is the controller's own), or its slot is active
  // under another agent (a slot is free again once taken as lost: no heartbeat for the slot
  // timeout). Heartbeats of an agent that is not its slot's registered one are ignored. A
  // Register with `rejoin` (its agent followed a new leader) takes the slot back as it was,
  // with its workers running.
  void on_message(const std::string& identity, const control::Envelope& msg);
  void set_pump(std::function<void()> pump) { pump_ = std::move(pump); }
  // Where the host records what the job's event log shows of the standbys (a slot checked
  // again, one that cannot be made ready): the controller's ControllerOptions::on_event.
  void set_event_sink(std::function<void(const std::string&, const EventFields&)> sink) {
    on_event_ = std::move(sink);
  }

  // Waits until every slot has registered (or `timeout` passes: false).
  bool wait_for_slots(std::chrono::milliseconds timeout, const volatile int* stop);

  SlotLayout slot_layout() const override { return layout_; }
  void attach(JobMembership* membership, Inbox inbox) override;
  void spawn(int rank, const std::map<std::string, std::string>& env) override;
  void kill(int rank) override;
  bool spawn_extra(int slot, int id, const std::map<std::string, std::string>& env) override;
  void kill_extra(int slot, int id) override;
  std::optional<RankExit> poll_exit() override;
  void stop_all(int sig, std::chrono::milliseconds grace) override;
  std::map<int, policy::Holdings> survey(const Topology& topo, bool replica_backups) override;
  void finish() override;
  int slot_of(int rank) const override { return members_->slot_of(rank); }
  std::vector<int> ranks_on(int slot) const override { return members_->ranks_on(slot); }
  double slot_silence_s(int slot) const override;
  void refresh() override;
  void fill_status(control::StatusReply* reply) const override;
  void adopt(int rank, int parked_index) override { adopt_[rank] = parked_index; }
  void evict(int slot) override;
  void renumber(const std::map<int, int>& old_to_new, int new_world) override;
  // Asks every active slot's agent to capture its workers' stacks and waits for the answers
  // (pumping the control plane) up to `timeout` and kStacksTrip for the trip. Each agent's
  // capture is held under half the slot timeout: it sends no heartbeat meanwhile.
  std::map<int, control::RankStacks> capture_stacks(std::chrono::milliseconds timeout) override;
  int await_rejoin(std::chrono::milliseconds timeout) override;
  // After finish(): waits up to `grace` until every agent told to shut down has closed its
  // connection (it took the command and exited), so that the controller's process, ending
  // next, drops no queued shutdown.
  void await_shutdown(std::chrono::milliseconds grace);
  // The job's exit status, carried by the shutdown finish() sends.
  void set_exit_code(int code) { exit_code_ = code; }
  // The slot whose agent started this controller (a candidate that leads): finish() leaves it
  // out, and await_shutdown() tells it last, since that agent ends this process with it.
  void set_own_slot(int slot) { own_slot_ = slot; }

  // Handles the agents' pending messages (heartbeats answered, the rest to the controller's
  // inbox): for a caller that waits on something else (etcd) and must not leave the agents
  // without an answer for detect.controller_timeout_ms.
  void keep_alive() { poll_plane(); }

  // Starts an etcd member on each of `slots` (agent_host_etcd.cc; robust/etcd_member_place.h
  // chooses them), named "slot<k>", on the ports each registered, data under
  // `data_root`/slot<k>, logs under `log_dir`, and waits up to `timeout` for every agent to say
  // its process runs (not that the cluster is healthy: the caller's client waits for that).
  // Returns their client endpoints ("host:port"). Throws keel::Error naming the slot and why
  // one could not be started.
  std::vector<std::string> start_etcd_members(const std::vector<int>& slots,
                                              const std::string& data_root,
                                              const std::string& log_dir,
                                              std::chrono::milliseconds timeout);
  // One member named `name` on `slot`, added to the running cluster (EtcdClient::member_add,
  // whose answer gives `cluster`) to replace a lost one: sends the command and returns, so
  // that the controller's loop goes on while the agent starts it; etcd_member_started says
  // when the agent answered.
  void send_etcd_member_start(int slot, const std::string& name, const std::string& cluster,
                              const std::string& data_root, const std::string& log_dir);
  // The answer to the last etcd_start sent to `slot`: nullopt while there is none, "" when
  // the member's process runs, else why it could not be started.
  std::optional<std::string> etcd_member_started(int slot) const;
  // The peer URL an etcd member on `slot` would have ("https://host:port"), and its clients'.
  std::string etcd_peer_url(int slot) const;
  std::string etcd_client_url(int slot) const;
  // Whether `slot` is lost (its agent silent or its connection closed).
  bool slot_lost(int slot) const { return members_->link(slot) == JobMembership::Link::kLost; }
  // For a slot lost by its heartbeats' silence (a partition, a power loss: its processes may
  // live on, its connections stay open), when it was last heard from; nullopt for a slot that
  // is not lost or whose connection closed (its processes died).
  std::optional<std::chrono::steady_clock::time_point> lost_silent_since(int slot) const;
  // Whether `slot`'s agent is known dead: its connection closed and its liveness port refused
  // (its host up, its process gone), whether or not the slot was declared lost yet. Never
  // for a slot merely silent (cut off, it may come back).
  bool agent_gone(int slot) const;
  bool slot_up(int slot) const { return up(slot); }
  int slot_count() const { return int(agents_.size()); }
  // Each slot's failure domain as its agent registered it ("": not known).
  std::vector<std::string> failure_domains() const;
  // Where the job's etcd is now (the controller's client, which follows a cluster keel started
  // as its members are replaced): what a process started from now on is given (a worker's
  // KEEL_ETCD and KEEL_STORE_ADDR, an agent's welcome), instead of the endpoints follow() was
  // given, which the replacements leave behind.
  void follow_etcd_members(std::function<std::vector<std::string>()> now) {
    etcd_now_ = std::move(now);
  }

 private:
  // What the transport knows of a slot's agent.
  struct Agent {
    std::string identity, host;
    std::chrono::steady_clock::time_point last_heartbeat;
    // When its connection closed with no silence before it (its process died, or it reset):
    // reset by its next message.
    std::optional<std::chrono::steady_clock::time_point> closed_at;
    bool lost_silent = false;  // lost by its heartbeats' silence, not a closed connection
    int pid = 0;
    int registrations = 0;                         // Register messages received
    int etcd_client_port = 0, etcd_peer_port = 0;  // free on its host when it registered
    int liveness_port = 0;                         // Register.liveness_port
    std::string failure_domain;                    // Register.failure_domain
    bool process_gone = false;  // its closed connection's probe was refused (for the message)
    std::chrono::milliseconds close_grace{0};  // how long closed_at waits for it to come back
    std::chrono::steady_clock::time_point reprobed_at;  // its port answered: the last retry
    // Per parked worker of the standby generation in force: its self-check (absent: not
    // known yet), read from the store by refresh().
    std::vector<std::optional<bool>> self_check;
    // Standby upkeep (agent_host_standby.cc): times in a row it was checked again after a
    // parked worker ended, and whether that reset is under way.
    int standby_restarts = 0;
    bool standby_restarting = false;
  };
  bool up(int slot) const { return members_->link(slot) == JobMembership::Link::kUp; }
  // Whether `slot` is among the first `candidates_` live slots (it is up).
  bool wants_candidate(int slot) const;
  // A command of `kind`, carrying the membership in force.
  control::Envelope command(control::Command::Kind kind) const;
  void send(int slot, const control::Envelope& msg);
  // Why a Register from `identity` cannot be taken ("" if it can).
  std::string refusal(const std::string& identity, const control::Register& reg) const;
  void check_heartbeats();
  // The job's etcd endpoints now (follow_etcd_members), or as follow() gave them.
  std::vector<std::string> etcd_endpoints() const;
  // A spawn's environment with the job's etcd as it is now (KEEL_ETCD, KEEL_STORE_ADDR).
  void with_current_etcd(google::protobuf::Map<std::string, std::string>* env) const;
  // Takes the plane's closed connections: each agent's closed_at, process_gone, close_grace.
  void note_closed();
  // Starts `slot`'s parked workers for its next standby check generation.
  void start_standby(int slot);
  // A parked worker of standby `slot` ended (`e`): the slot is checked again, or said
  // unusable (its own checks failed, or its workers keep ending).
  void on_standby_exit(int slot, const control::Event& e);
  // Takes up what arrived on the control plane (see on_message).
  void poll_plane();
  // The command that starts etcd member `name` (data and log under the given folders; existing:
  // it joins the running cluster).
  control::Envelope etcd_start(const std::string& name, const std::string& cluster,
                               const std::string& data_root, const std::string& log_dir,
                               bool existing) const;
  // Throws if `slot`'s agent did not say its etcd member runs.
  void check_etcd_reply(int slot, std::chrono::milliseconds timeout) const;
  // Waits (polling the control plane) until `done` or `timeout`.
  void wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout);

  ControlServer* server_;
  std::shared_ptr<Store> store_;
  std::string job_;
  int slot0_pid_ = 0;
  int exit_code_ = 0;
  int own_slot_ = -1;
  std::vector<std::string> etcd_endpoints_;  // follow(): empty until the job's etcd is up
  int candidates_ = 0;                       // controller candidates the job keeps on live slots
  std::set<int> candidate_at_;  // slots told to run one (a lost one is told again on return)
  SlotLayout layout_;
  JobMembership* members_ = nullptr;  // the controller's (attach)
  // The host's own until attach(): only a host driven without a controller (tests) uses it.
  std::unique_ptr<JobMembership> unattached_;
  std::vector<Agent> agents_;
  std::vector<std::string> worker_argv_;
  std::map<std::string, std::string> worker_env_;       // for standby workers (no rank yet)
  std::function<std::vector<std::string>()> etcd_now_;  // follow_etcd_members
  std::chrono::milliseconds slot_timeout_;
  std::function<void()> pump_;
  Inbox inbox_;               // the controller's (attach)
  std::map<int, int> adopt_;  // rank -> parked worker index on its (new) slot
  std::vector<bool> alive_;   // rank has a running worker as far as we know
  std::set<int> killing_;     // ranks whose exit we caused (not reported)
  std::deque<RankExit> exits_;
  std::map<int, control::Event> survey_replies_;  // slot -> snapshots event
  std::map<int, control::Event> stacks_replies_;  // slot -> stacks event
  std::map<int, control::Event> etcd_replies_;    // slot -> etcd_started event
  // Standby slots that registered before the store was known (set_store).
  std::vector<int> deferred_standby_;
  std::function<void(const std::string&, const EventFields&)> on_event_;  // set_event_sink
};

}  // namespace keel
