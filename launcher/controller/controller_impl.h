// The controller's state (launcher/controller/controller.h): the one JobMembership and the
// parts that own the rest, each in its own file pair: the Detector (detector.h), the
// UpdateManager (update_manager.h), the ReplayCoordinator (replay_coordinator.h), the
// DiagnoseCoordinator (diagnose_coordinator.h) and the SlowWatcher (slow_watcher.h).
// controller.cc runs the loop, the control plane and keel-ctl; controller_recovery.cc is the
// one epoch transition that carries out every plan of robust/recovery_policy.h. The
// decisions are not here: they are in robust/. Private to launcher/controller/.
#pragma once

#include "launcher/controller/controller.h"

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/control_plane.h"
#include "launcher/controller/context.h"
#include "launcher/controller/detector.h"
#include "launcher/controller/diagnose_coordinator.h"
#include "launcher/controller/incident.h"
#include "launcher/controller/membership.h"
#include "launcher/controller/replay_coordinator.h"
#include "launcher/controller/slow_watcher.h"
#include "launcher/controller/tcp_refusals.h"
#include "launcher/controller/update_manager.h"
#include "launcher/recovery_protocol.h"
#include "proto/membership.pb.h"
#include "robust/ladder.h"
#include "robust/recovery_policy.h"
#include "robust/stop_rules.h"

namespace keel {

// What the controller is doing, as keel-ctl status names it (run_state_name).
enum class RunState { kStarting, kTraining, kRecovering, kWaiting };
const char* run_state_name(RunState s);

struct Controller::Impl {
  ControllerOptions o;
  RankHost* host;
  std::shared_ptr<Store> store;
  ControlServer* server;
  JobMembership members;
  ControllerContext ctx;
  RunState state = RunState::kStarting;
  // The decisions' memory and the command log's progress: with `members`, `transition` and
  // the update's state they make the job's record in etcd (job_state()), of which these are
  // the leader's working copy; a new leader starts from the record, not from zero.
  policy::StopMemory stops;        // the stop rules' memory (robust/stop_rules.h)
  policy::LadderMemory ladder;     // the escalation ladder's (robust/ladder.h)
  membership::Rebuild transition;  // the newest epoch's Rebuild
  int64_t commands = 0;            // keel-ctl commands recorded in the command log
  int64_t commands_done = 0;       // of those, carried out or refused
  std::string recorded_state;      // job_state_key() of the record etcd holds
  std::string stop_why;            // why recover() said the job must stop (the report's reason)
  bool end_recorded = false;       // record_end() wrote (or tried to write) the job's end
  std::function<void(const std::string&, const control::Envelope&)> on_agent;
  std::set<int> finished;  // ranks that exited cleanly (the job's end)
  int64_t last_printed = -1;
  // keel-ctl stacks requests (identity, name), served from the loop: a capture pumps the
  // control plane itself, so it cannot run inside pump().
  std::vector<std::pair<std::string, std::string>> stacks_requests;
  // Control-plane messages the host set aside while it waited on its agents (take_up).
  std::deque<std::pair<std::string, control::Envelope>> inbox;
  Detector detector;
  UpdateManager updates;
  ReplayCoordinator replays;
  DiagnoseCoordinator diagnostics;
  SlowWatcher slow;
  TcpRefusals tcp_refusals;

  Impl(ControllerOptions opts, RankHost* h, std::shared_ptr<Store> s, ControlServer* srv);
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // controller.cc
  void spawn(int rank, bool restarted) { host->spawn(rank, ctx.rank_env(rank, restarted)); }
  bool stopping() const { return o.stop_signal && *o.stop_signal; }
  // Handles what arrived on the control plane (never called by the host: it hands what is
  // not its own to take_up while it waits on its agents).
  void pump();
  void take_up(const std::string& identity, const control::Envelope& m);
  void handle(const std::string& identity, control::Envelope m);
  // keel-ctl inject, update and replay: recorded in the command log (fenced) before they are
  // carried out, marked done after; `n` is the command's number. `redo`: a command a leader
  // before this one recorded and did not mark done, carried out now unless its effect is
  // already there. Returns the reply.
  control::Envelope command(int64_t n, const control::Envelope& m, bool redo);
  // A new leader's start: carries out, once, the commands recorded and not done.
  void resume_commands();
  void on_progress(control::WorkerProgress p);
  // Writes a `refused` event (plane tcp) when process `pid`'s count of refusals rose.
  void note_tcp_refusals(int64_t pid, const std::string& who, int64_t total);
  void print_progress(const control::WorkerProgress& p);
  void status(control::StatusReply* r);
  void inject(const std::string& fault, control::InjectReply* r);
  void replay_request(control::ReplayReply* r);
  int run();
  // takeover.cc: a new leader's start. Waits for the agents to register again with their
  // workers (slots that do not within detect.slot_timeout_ms are lost, their ranks' exits
  // queued for the loop), and says so in the event log.
  void take_over();
  // An epoch transition the controller before this one began and did not finish: the abort
  // of the next epoch is in the store without its rebuild (the ranks wait for it). This
  // leader completes it under the same epoch, from the acks on (never a second epoch over
  // half of one). nullopt when there is none.
  std::optional<Detected> interrupted_transition();
  // Incidents counted in the ranks' store but not written there (the controller before this
  // one died between the two): copied from etcd's control state, or recorded as lost, so
  // that the report's reader finds every one it counts.
  void repair_incidents();
  // One pass of the loop's periodic checks: a failure to recover from, if any.
  std::optional<Detected> poll_failures(Clock::time_point* next_error_poll,
                                        Clock::time_point* next_grow_check);
  // Stops every rank, records why (etcd's end first, then the event log, the report when
  // rank 0 wrote none) and returns `code`. Throws Deposed, stopping nothing, when another
  // controller leads now: the ranks are its own.
  int stop_job(const std::string& why, int code);
  // Writes the job's end to etcd (once; nothing without etcd): a candidate that wins later,
  // and keel-launch when its own controller is gone, learn the exit status there. Throws
  // Deposed when another controller leads; other failures are logged.
  void record_end(int code);
  // Another controller leads, or etcd refused this one's fenced write: it stops acting at
  // once (the ranks and agents are the new leader's), says so in one log line and an event
  // (with the fenced writes etcd refused), and returns kExitDeposed.
  int step_aside(const std::string& why);
  int stop_by_signal();       // 128 + the signal
  int stop_after_recovery();  // recover() said stop: recovery::kExitStopped, or a signal's
  void serve_stacks_requests();

  // controller_recovery.cc: the epoch transition. recover() moves the job to the next epoch
  // after a failure; false when the job must stop (a stop rule or the policy said so, or a
  // stop signal came while it waited), with stop_why set.
  bool recover(Detected d);
  // The stop rules, asked with the progress now (-1: unknown).
  bool must_stop(const Detected& d, int64_t progress_now);
  int64_t progress_now() const;
  // Waits for the acks of every rank not in `dead` (those that do not answer in time are
  // killed and join `dead`); folds in exits seen meanwhile.
  std::map<int, membership::Ack> collect_acks(int next, Detected* d);
  // The ladder's rung for `d` (robust/ladder.h) and its mechanism, run before the decision.
  policy::LadderStep climb(Detected* d, int64_t progress_now,
                           const std::map<int, policy::Holdings>& have, const policy::Options& po,
                           membership::Rebuild* epoch_plugin);
  // Asks the policy until it says more than "wait"; nullopt: a stop signal came meanwhile.
  std::optional<policy::Plan> decide(Detected* d, const std::map<int, policy::Holdings>& have,
                                     const policy::Options& po);
  // Carries out `plan` (a kRecover) as epoch `next`; `plugin` (path and hash in a Rebuild)
  // is the epoch's plugin when it changes with it. `t` gets the epoch and the times. `d`,
  // the failure recovered from (none for growing back or a cleared replay), is recorded as
  // an incident with the epoch, before any rank is told of it; returns that record.
  std::optional<report::Incident> carry_out(const policy::Plan& plan, int next, Transition* t,
                                            const membership::Rebuild* plugin = nullptr,
                                            const Detected* d = nullptr);
  // The membership's changes of `plan`, with the host carrying each out.
  void apply_membership(const policy::Plan& plan, Transition* t);
  // Writes rebuild/<E> for the membership's epoch, after etcd's record of it and `inc`, the
  // epoch's incident (one fenced transaction), and the incident's copy in the ranks' store:
  // a leader that dies anywhere in between leaves either no trace of the epoch (the next
  // completes the transition) or the epoch with its incident, never ranks told of an epoch
  // whose incident nobody recorded. `before`: the layout of the epoch before (a reshape's
  // copies are in it).
  // Returns the incident's index (-1: none).
  int64_t write_rebuild(const policy::Plan& plan, const membership::Rebuild* plugin,
                        const Topology* before = nullptr, const report::Incident* inc = nullptr);
  // After a shrink: once standby slots for a whole replica are ready, the job moves to an
  // epoch with one replica more.
  void maybe_grow();
  // The job's record as this leader knows it now (state::JobState).
  state::JobState job_state() const;
  // Between epoch transitions, writes the job's record when it changed (a standby found
  // ready, a slot back as a standby, an update's phase, a command done): a leader that takes
  // over must know which standbys are ready, or it waits for one that was ready all along.
  // Level-triggered: called every pass of the checks; a write only when something changed.
  void record_job_state();
  // The membership as the policy sees it, with the host's news read in.
  policy::ClusterView view();
  // Drops the store keys of epoch `e` that nothing reads once every rank has moved past it
  // (its communicators' rendezvous, acks, errors, abort, rebuild, backup addresses), so that
  // a job recovering thousands of times keeps its controller's memory flat. What the report
  // reads at the end (restored, restored_from, first_step) stays.
  void forget_epoch(int e);
};

}  // namespace keel
