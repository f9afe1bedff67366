// The controller's state (launcher/controller/controller.h), shared by controller.cc (the loop, the
// control plane, keel-ctl), controller_detect.cc (what counts as a failure: exits, lost
// slots, communication errors, hangs) and controller_recovery.cc (the one epoch transition
// that carries out every plan of robust/recovery_policy.h). The decisions are not here: they
// are in robust/. Private to launcher/.
#pragma once

#include "launcher/controller/controller.h"

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "launcher/control_plane.h"
#include "launcher/controller/event_fields.h"
#include "launcher/recovery_protocol.h"
#include "proto/membership.pb.h"
#include "robust/ladder.h"
#include "robust/recovery_policy.h"
#include "robust/slow_rules.h"

namespace keel {

using Clock = std::chrono::steady_clock;
using recovery::unix_now;

struct Controller::Impl {
  ControllerOptions o;
  RankHost* host;
  std::shared_ptr<Store> store;
  ControlServer* server;
  Topology topo;  // the layout now: data parallelism may have shrunk (recovery.on_no_standby)
  int world;
  int epoch = 0;
  membership::Membership members;  // the current epoch's; sent with every rebuild
  int incidents = 0;
  int64_t progress_at_last_incident = -2;
  int no_progress_incidents = 0;
  std::string state = "starting";
  std::function<void(const std::string&, const control::Envelope&)> on_agent;
  // Progress as the ranks last reported it, and when it arrived.
  std::map<int, std::pair<control::WorkerProgress, Clock::time_point>> progress;
  int64_t epoch_start_step = 0;
  int64_t last_min_step = -1;
  Clock::time_point last_advance = Clock::now();
  int64_t last_printed = -1;
  std::set<int> finished;  // ranks that exited cleanly (the job's end)
  // keel-ctl stacks requests (identity, name), served from the loop: a capture pumps the
  // control plane itself, so it cannot run inside pump().
  std::vector<std::pair<std::string, std::string>> stacks_requests;
  Clock::time_point stacks_for_stall{};  // the stall (last_advance) whose stacks were taken

  Impl(ControllerOptions opts, RankHost* h, std::shared_ptr<Store> s, ControlServer* srv);

  // controller.cc
  void event(const std::string& kind, const EventFields& fields);
  std::map<std::string, std::string> rank_env(int rank, bool restarted) const;
  void spawn(int rank, bool restarted) { host->spawn(rank, rank_env(rank, restarted)); }
  bool stopping() const { return o.stop_signal && *o.stop_signal; }
  void pump();
  void print_progress(const control::WorkerProgress& p);
  void status(control::StatusReply* r) const;
  void inject(const std::string& fault, control::InjectReply* r);
  int run();
  int stop_job(const std::string& why, int code);
  // Captures every worker's stacks into <run_dir>/stacks/<name>/ and groups them.
  control::StacksReply capture_stacks(const std::string& name);
  void serve_stacks_requests();

  // controller_detect.cc: a failure seen now, as an incident and the policy's input.
  struct Detected {
    report::Incident inc;
    policy::Failure failure;
  };
  Detected from_exit(const RankExit& ex);
  std::optional<Detected> comm_error();
  // The verdict of a failed SDC check, if the ranks' failure was one (robust/sdc_check.h).
  std::optional<Detected> sdc();
  std::optional<Detected> hang();
  // Silence alone cannot tell a dead machine from a cut network; an injected fault on the
  // slot can.
  void label_slot_loss(Detected* d, int slot);
  double median_step_s() const;

  // controller_slow.cc: fail-slow (robust/slow_rules.h). Rounds arrive with the progress
  // reports; once every rank sent round k, it is judged.
  void on_round(int rank, const control::RoundStats& round);
  // A degrader to swap for a standby, or nothing (a warning or an mfu_decline is recorded
  // as an incident on the spot and the job goes on).
  std::optional<Detected> fail_slow();
  // Records an incident that needs no recovery (a warning).
  void record_incident(report::Incident inc);
  SlowDetector slow_detector;
  std::map<int64_t, std::map<int, control::RoundStats>> rounds;  // round -> rank -> stats
  int64_t judged_round = -1;  // the newest round judged this epoch
  std::set<int> warned_slow;  // degraders named in a warning this epoch
  int slowest_rank = -1;      // of the last judged round, for progress lines
  double slowest_factor = 0;
  // The escalation ladder's memory (robust/ladder.h, climb).
  policy::LadderMemory ladder;

  // controller_update.cc: hot updates of the plugin (keel-ctl update).
  enum class UpdatePhase { kChecking, kStaged, kApplying, kProbation };
  void request_update(const control::UpdateRequest& rq, control::UpdateReply* r);
  void poll_updates();
  void applied_update(int64_t step);
  void record_update(const report::Update& u);
  // Gives `u` the next id and publishes it to the ranks (and to the report).
  void publish_update(report::Update* u);
  // Whether the applied update is on probation with `completed` steps done.
  bool in_probation(int64_t completed) const;
  void end_probation(int64_t completed);
  // A failure in probation: the recovery rolls the plugin back (into `rb`) and the state to
  // the step the update was applied at.
  void rollback_update(Detected* d, membership::Rebuild* rb);
  int update_active = -1;  // the update in progress or on probation
  UpdatePhase update_phase = UpdatePhase::kChecking;
  Clock::time_point update_deadline{};
  report::Update update_plan;
  std::string plugin_path, plugin_hash, plugin_version;  // the job's plugin now (once known)
  std::string previous_version;                          // of the plugin an applied update replaced
  bool plugin_changed = false;  // an update was applied: progress lines name the plugin

  // controller_replay.cc: the stop-time dual-phase replay (robust/sdc_replay.h).
  bool replay_possible(std::string* why) const;
  // Replays the step after `step` from snapshot `step` on groups of machines, contiguous then
  // strided; returns the machines in a failing group of both (empty: none) and says how it
  // went in *detail.
  std::vector<int> replay(int64_t step, std::string* detail);
  // An SDC failure without a named rank: the replay may name one (a rank of the machine).
  void pin_by_replay(Detected* d, const std::map<int, policy::Holdings>& have);
  // keel-ctl replay asked for one.
  Detected requested_replay();
  bool replay_requested = false;

  // controller_diagnose.cc: stop-time diagnostics (DESIGN.md, Failure handling, rung 2). With
  // every training worker parked in the recovery wait, checks the machines of
  // `suspect_slots` (GEMM, golden mini-GPT, a collective test per group) within
  // recovery.diagnostics_timeout_ms; fills inc's diagnostics, diagnostics_summary and
  // diagnosed_at, and returns the suspect slots that failed (empty: all passed).
  std::vector<int> diagnose(const std::set<int>& suspect_slots, report::Incident* inc);

  // controller_recovery.cc: drops the store keys of epoch `e` that nothing reads once every
  // rank has moved past it (its communicators' rendezvous, acks, errors, abort, rebuild,
  // backup addresses), so that a job recovering thousands of times keeps its controller's
  // memory flat. What the report reads at the end (restored, restored_from, first_step)
  // stays.
  void forget_epoch(int e);
  // controller_recovery.cc: moves the job to the next epoch after a failure. Returns false
  // when the job must stop (the policy said so, or a stop signal came while it waited).
  bool recover(Detected d);
  // After a shrink: once standby slots for a whole replica are ready, the job moves to an
  // epoch with one replica more.
  void maybe_grow();
  policy::ClusterView view() const;
  // The policy's options; `with_checkpoint` also finds the newest complete persistent
  // checkpoint (reads and verifies it: only when a failure is decided, not on every poll).
  policy::Options policy_options(bool with_checkpoint) const;
  // Waits for the acks of every rank not in `dead` (those that do not answer in time are
  // killed and join `dead`); folds in exits seen meanwhile.
  std::map<int, membership::Ack> collect_acks(int next, Detected* d);
  // Carries out `plan` (a kRecover) as epoch `next`; `plugin` (path and hash in a Rebuild)
  // is the epoch's plugin when it changes with it.
  void carry_out(const policy::Plan& plan, int next, report::Incident* inc,
                 const membership::Rebuild* plugin = nullptr);
  void update_membership();
};

}  // namespace keel
