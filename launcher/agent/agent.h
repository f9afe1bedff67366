// The agent of one slot (machine), inside every keel-launch process: registers with the
// controller, heartbeats, starts and kills the slot's workers when told, reports each
// worker's exit (code or signal, with the last lines of its log), answers surveys of the
// snapshots its shared memory holds, runs the slot's etcd member when told (the first 3 or
// 5 slots, or one that replaces a lost member), and at shutdown removes that shared memory (the
// workers' own snapshots and the backups the slot held for others). The controller answers
// every heartbeat; an agent that hears nothing from it for `controller_timeout` stops its
// workers, removes that shared memory and exits with kExitControllerLost, so nothing
// lingers when slot 0 dies (the job is then restarted with keel-launch --resume).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include <sys/types.h>

#include "launcher/agent/slot_member.h"
#include "launcher/control_plane.h"
#include "launcher/etcd/etcd_members.h"
#include "launcher/etcd/leader_link.h"
#include "launcher/exit_codes.h"
#include "launcher/timings.h"
#include "parallel/socket_util.h"

namespace keel {

struct AgentOptions {
  int slot = 0;
  int workers = 1;             // worker capacity of the slot
  std::string host;            // the slot's reachable address, for the controller
  std::string controller;      // the control plane's endpoint
  std::string log_dir;         // each worker's stdout and stderr: log_dir/rank<R>.log
  bool zero1 = false;          // parallel.zero1: with the layout, whose backups a rank holds
  std::string job;             // names the job's shared memory
  std::string failure_domain;  // Register.failure_domain ("": not known)
  // How long the agent tries to reach the controller before it gives up (exit 1): the
  // controller binds before any slot starts, so only a wrong endpoint or a dead controller
  // takes this long.
  std::chrono::milliseconds register_timeout{std::chrono::seconds(10)};
  // detect.controller_timeout_ms: silence from the controller, once it welcomed the agent,
  // after which the slot is stopped (0: never). keel-launch always sets it from the config.
  std::chrono::milliseconds controller_timeout{std::chrono::seconds(10)};
};

// Agent::run's results beside the job's own status (kExitControllerLost, kExitJoinRefused,
// kExitSlotGone): launcher/exit_codes.h.

class Agent {
 public:
  explicit Agent(AgentOptions o);
  ~Agent();
  // Runs until the controller says shutdown (the job's exit status), the controller cannot be
  // reached at the start (1), refuses the registration (kExitJoinRefused, the reason said on
  // stderr; kExitSlotGone when a new leader refuses it), the controller is silent for
  // controller_timeout (kExitControllerLost), or `stop` is set (from another thread or a signal
  // handler; 0, and if the controller's process is gone, the job's shared memory on this machine is
  // removed too).
  int run(const volatile int* stop = nullptr);

 private:
  // Every poll of the control plane waits this long at most, so a worker's exit is reported
  // within it; heartbeats go out at this rate (the controller answers each: keepalive).
  static constexpr std::chrono::milliseconds kPoll{20};
  static constexpr std::chrono::milliseconds kHeartbeatEvery = timings::kHeartbeatEvery;
  // A stacks command without its own timeout: a capture of one worker takes milliseconds.
  static constexpr std::chrono::milliseconds kDefaultStackTimeout{1000};
  // A new leader is taken up once the current one has been silent this long, and the
  // leadership is read this often beside its watch (launcher/timings.h says why).
  static constexpr std::chrono::milliseconds kLeaderSilence = timings::kLeaderSilence;
  static constexpr std::chrono::milliseconds kLeaderRecheck = timings::kLeaderRecheck;
  // How often a controller candidate that keeps dying is started again.
  static constexpr std::chrono::milliseconds kCandidateRestartEvery{1000};

  AgentOptions o_;
  std::unique_ptr<ControlClient> client_;  // to the leader controller (controller_)
  std::string controller_;                 // its endpoint: o_.controller, then each new leader's
  bool welcomed_ = false;
  bool waiting_for_failover_ = false;  // silent past the timeout, etcd showing a leader
  // The newest leader term etcd confirmed to this agent (its LeaderLink; 0 without etcd): a
  // message of an older term is a deposed leader's, dropped at the door (entry_), and every
  // message this agent sends carries it.
  std::atomic<int64_t> confirmed_term_{0};
  EntryCheck entry_;
  bool rejoined_ = false;  // registered again with a new leader (a refusal: kExitSlotGone)
  // With the job's etcd (Command follow): the leadership followed, a new leader's endpoint
  // (set by the LeaderLink's thread) taken up by run(); and this slot's controller candidate.
  std::vector<std::string> etcd_endpoints_;
  std::unique_ptr<LeaderLink> leader_link_;
  std::mutex leader_mu_;
  std::string leader_endpoint_;
  pid_t candidate_ = 0;
  bool is_candidate_ = false;  // this slot runs one (told by follow)
  std::chrono::steady_clock::time_point candidate_started_{};
  std::map<int, pid_t> workers_;  // rank -> pid
  std::map<int, pid_t> parked_;   // standby index -> pid of a worker waiting for a rank
  std::set<int> hosted_;          // every rank this slot ran (its shared memory is here)
  // rank -> its worker's last worker_exit, until the rank runs here again: told again to a
  // new leader on rejoin (Register.exited), as the one that died may not have seen it.
  std::map<int, control::Event> exited_;
  // The slot's etcd member (Command etcd_start), on the ports picked when it registered; it
  // stops with the agent.
  SlotMember member_;
  // Register.liveness_port's socket: listening while this process lives, each connection
  // closed at once (accept_liveness_probes, every poll).
  detail::Fd liveness_;
  void accept_liveness_probes();

  // `rejoin`: to a new leader, with the workers that run (Register.running, parked).
  void send_register(bool rejoin = false);
  // Command follow (or a welcome naming the job's etcd): follows the leadership and, if told,
  // starts this slot's controller candidate.
  void follow(const control::Command& c);
  // A new leader published itself and the one this agent talks to has gone quiet: the agent
  // connects to the new one and registers again. Returns whether it switched.
  bool switch_leader(std::chrono::steady_clock::duration silent);
  void start_candidate();

  // A candidate that ended while the job goes on (it led and was killed, or was deposed) is
  // replaced, so that the job outlives any number of controller deaths, not just as many
  // as it had candidates.
  void keep_candidate();
  void stop_candidate();
  // Sends `ev` (its slot filled in) under `epoch`.
  void send_event(int epoch, control::Event ev);
  // One command of the controller; a value: run() returns it.
  std::optional<int> on_command(int epoch, const control::Command& c);
  void on_spawn(int epoch, const control::Command& c);
  void on_kill(int epoch, const control::Command& c);
  // Answers with the snapshots the slot holds, for the layout in the command's Membership.
  void on_survey(int epoch, const control::Command& c);
  void on_stacks(int epoch, const control::Command& c);
  void on_renumber(const control::Command& c);
  void on_etcd_start(int epoch, const control::Command& c);
  // Reports every worker (and parked standby) that ended since the last call.
  void reap_workers();
  std::string log_of(int rank) const;
  std::string standby_log_of(int index) const;
  void kill_workers();          // SIGKILLs and reaps every worker, parked ones included
  void remove_shared_memory();  // the segments of every rank in hosted_
  int stop_without_controller(std::chrono::milliseconds silent);
};

}  // namespace keel
