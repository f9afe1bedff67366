// Hot updates of the model's plugin, the controller's part (keel-ctl update; the ranks' part
// is launcher/worker/worker_update.cc). Two phases through the store: the plan goes out
// (report::Update) and every rank checks the new plugin against its state
// (store::UpdateCheck); if all fit, the controller picks a step ahead of every rank and each
// switches before it (store::UpdateDecision apply_before_step), else the update is refused
// (UpdateDecision refused) and nothing changes. A lazy update waits for the next recovery.
// For update.probation_steps after that (robust/update_probation.h), a failure rolls the
// plugin back with the recovery (the epoch transition asks rollback()).
#pragma once

#include <optional>
#include <string>

#include "launcher/controller/context.h"
#include "proto/control.pb.h"
#include "proto/control_state.pb.h"
#include "proto/membership.pb.h"

namespace keel {

class UpdateManager {
 public:
  explicit UpdateManager(const ControllerContext& ctx) : ctx_(ctx) {}

  // keel-ctl update; `completed` is the newest step any rank completed (an --at-step at or
  // before it is refused, as keel-ctl inject refuses a step that has passed).
  // `command`: its number in the command log (the update's record names it).
  void request(const control::UpdateRequest& rq, int64_t completed, int64_t command,
               control::UpdateReply* r);
  // Moves the update in progress on: collects the ranks' checks and decides, or sees every
  // rank switched. `ahead`: the newest step any rank reported (or the epoch's first).
  void poll(int64_t ahead);
  // A lazy update staged for the next recovery: puts its plugin in *rb (true), else false.
  bool staged(membership::Rebuild* rb) const;
  // The update in progress took effect after `step` (every rank switched, or the recovery
  // that carried a lazy one restored `step`).
  void applied(int64_t step);
  // Whether the applied update is on probation with `completed` steps done.
  bool in_probation(int64_t completed) const;
  // Ends the probation once `completed` steps are past it (the update passed).
  void end_probation(int64_t completed);
  // A failure in probation (or rung 3 asked for it): the recovery rolls the plugin back
  // (into `rb`) and the state to the step the update was applied at.
  void rollback(Detected* d, membership::Rebuild* rb);
  // Whether the newest update was applied and has a plugin to go back to.
  bool can_roll_back() const;
  // The newest step an update was applied at (-1: none), for the ladder.
  int64_t last_applied_step() const { return last_applied_step_; }
  // " | plugin <version> <hash>" once an update changed the plugin, for progress lines.
  std::string progress_label() const;

  // What a new leader needs to go on with the update in progress or on probation (roll it
  // back after a failure in probation, say): part of the job's record in etcd.
  state::UpdateState to_proto() const;
  // A new leader's start: the update as the leader before it left it.
  void restore(const state::UpdateState& s);
  // Whether command `n` of the command log already published its update (a new leader
  // carrying out the commands the one before accepted must not publish one twice).
  bool published_by(int64_t command) const;

 private:
  enum class Phase { kChecking, kStaged, kApplying, kProbation };
  void set_outcome(report::UpdateOutcome o);
  void record(const report::Update& u);
  // Gives `u` the next id and publishes it to the ranks (and to the report).
  void publish(report::Update* u);
  void decide(int64_t ahead);
  void set_current_plugin(const std::string& path, const std::string& hash);

  const ControllerContext& ctx_;
  int active_ = -1;  // the update in progress or on probation
  Phase phase_ = Phase::kChecking;
  Clock::time_point deadline_{};
  report::Update plan_;
  std::string plugin_path_, plugin_hash_, plugin_version_;  // the job's plugin now (once known)
  std::string previous_version_;  // of the plugin an applied update replaced
  bool plugin_changed_ = false;   // an update was applied: progress lines name the plugin
  int64_t last_applied_step_ = -1;
};

}  // namespace keel
