#include "launcher/controller/update_manager.h"

#include <algorithm>

#include "launcher/controller/etcd_control_state.h"
#include "launcher/recovery_protocol.h"
#include "model/plugin_loader.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/update_probation.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// A rank that takes longer than this to check a plugin is refusing it.
constexpr std::chrono::seconds kCheckTimeout{30};
// How far ahead of the newest reported step an update applies: ranks are within a step of
// each other (their collectives hold them together), and reports lag by at most one.
constexpr int64_t kApplyAhead = 3;

}  // namespace

void UpdateManager::set_outcome(report::UpdateOutcome o) {
  plan_.set_outcome(o);
}

void UpdateManager::record(const report::Update& u) {
  if (ctx_.o->state) ctx_.o->state->update(u);
  set_message(*ctx_.store, keys::update_record_key(u.id()), u);
}

void UpdateManager::publish(report::Update* u) {
  // The plan before the count: a rank that sees the count finds its plan.
  u->set_id(int(ctx_.store->add(keys::kUpdateCount, 0)));
  record(*u);
  set_message(*ctx_.store, keys::update_key(u->id()), *u);
  ctx_.store->add(keys::kUpdateCount, 1);
}

void UpdateManager::set_current_plugin(const std::string& path, const std::string& hash) {
  plugin_path_ = path;
  plugin_hash_ = hash;
  store::Plugin p;
  p.set_path(path);
  p.set_hash(hash);
  // etcd's copy is the job's record (to_proto), written by the controller's loop.
  set_message(*ctx_.store, keys::kPluginCurrent, p);
}

void UpdateManager::request(const control::UpdateRequest& rq, int64_t completed, int64_t command,
                            control::UpdateReply* r) {
  report::Update u;
  u.set_command(command);
  u.set_plugin(rq.plugin());
  u.set_requested_at(recovery::unix_now());
  u.set_applied_step(-1);
  u.set_at_step(rq.at_step());
  u.set_mode(rq.lazy() ? report::lazy : rq.at_step() > 0 ? report::at_step : report::urgent);
  u.set_outcome(report::pending);
  if (active_ >= 0) {
    // What is wrong with the file is said first: "still in progress" would send the user back
    // to wait, only to be refused for the file later.
    r->set_ok(false);
    try {
      Plugin::load_copy(rq.plugin());
    } catch (const std::exception& e) {
      r->set_message(detail::concat("refused: ", e.what()));
      return;
    }
    r->set_message(detail::concat(
        "update ", active_, " is still in progress",
        phase_ == Phase::kProbation
            ? detail::concat(" (on probation until step ",
                             plan_.applied_step() + ctx_.cfg().update().probation_steps(), ")")
            : std::string(),
        "; ask again once it is done"));
    return;
  }
  // --at-step S switches once S steps are done: a step the job has passed (or one it never
  // reaches) would switch at another step than asked, so it is refused, as inject's is.
  const int64_t steps = ctx_.cfg().train().steps();
  if (rq.at_step() > 0 && (rq.at_step() <= completed || rq.at_step() >= steps)) {
    r->set_ok(false);
    r->set_message(
        rq.at_step() >= steps
            ? detail::concat("--at-step ", rq.at_step(), ": the job has ", steps,
                             " steps (train.steps); give a step below it")
            : detail::concat("--at-step ", rq.at_step(), ": step ", rq.at_step(),
                             " has passed: the job has completed ", completed, " step(s); give ",
                             completed + 1 < steps
                                 ? detail::concat("--at-step ", completed + 1, " or later")
                                 : std::string("no --at-step")));
    return;
  }
  if (plugin_hash_.empty()) {
    // The job's plugin as configured, for the record and for a rollback.
    std::shared_ptr<Plugin> now = Plugin::load_copy(ctx_.cfg().model().plugin());
    plugin_path_ = now->path();
    plugin_hash_ = now->hash();
    plugin_version_ = now->version();
  }
  u.set_previous_plugin(plugin_path_);
  u.set_previous_hash(plugin_hash_);
  try {
    // The controller loads it first: a file that is no plugin of this ABI is refused here,
    // before any rank spends a step on it.
    std::shared_ptr<Plugin> next = Plugin::load_copy(rq.plugin());
    u.set_hash(next->hash());
    u.set_version(next->name() + " " + next->version());
  } catch (const std::exception& e) {
    u.set_outcome(report::refused);
    u.set_why(e.what());
    // Published all the same, so that the ranks, which follow the plans in order, go past it.
    publish(&u);
    r->set_ok(false);
    r->set_id(u.id());
    r->set_message("refused: " + u.why());
    ctx_.event("update",
               EventFields().add("id", u.id()).add("outcome", "refused").add("why", u.why()));
    return;
  }
  publish(&u);
  const int64_t n = u.id();
  active_ = int(n);
  phase_ = Phase::kChecking;
  deadline_ = Clock::now() + kCheckTimeout;
  plan_ = u;
  r->set_ok(true);
  r->set_id(int(n));
  r->set_message(detail::concat("update ", n, ": every rank checks ", rq.plugin(), " (build ",
                                u.hash(), ") against its state, then ",
                                rq.lazy() ? "it waits for the next recovery"
                                : rq.at_step() > 0
                                    ? detail::concat("switches before step ", rq.at_step() + 1)
                                    : std::string("switches at a step boundary"),
                                "; the outcome is in the report (updates)"));
  ctx_.event("update_request", EventFields()
                                   .add("id", int(n))
                                   .add("plugin", rq.plugin())
                                   .add("mode", report::UpdateMode_Name(u.mode())));
  LOG(INFO) << r->message();
}

void UpdateManager::poll(int64_t ahead) {
  if (active_ < 0) return;
  if (phase_ == Phase::kChecking) {
    decide(ahead);
    return;
  }
  if (phase_ != Phase::kApplying) return;
  int64_t step = -1;
  for (int rk = 0; rk < ctx_.members->world(); ++rk) {
    const auto s = try_get_message<store::Step>(*ctx_.store, keys::update_applied_key(active_, rk));
    if (!s) return;  // not every rank has switched yet
    step = s->step();
  }
  applied(step);
}

void UpdateManager::decide(int64_t ahead) {
  const int64_t n = active_;
  const int world = ctx_.members->world();
  std::string refused;
  int checked = 0;
  for (int rk = 0; rk < world; ++rk) {
    const auto c = try_get_message<store::UpdateCheck>(*ctx_.store, keys::update_check_key(n, rk));
    if (!c) continue;
    ++checked;
    if (!c->ok() && refused.empty()) refused = c->why();
  }
  if (checked < world && Clock::now() < deadline_) return;
  if (checked < world && refused.empty())
    refused = detail::concat(world - checked, " rank(s) did not check the plugin within ",
                             kCheckTimeout.count(), " s");
  store::UpdateDecision decision;
  if (!refused.empty()) {
    decision.set_refused(refused);
    set_message(*ctx_.store, keys::update_apply_key(n), decision);
    set_outcome(report::refused);
    plan_.set_why(refused);
    record(plan_);
    LOG(WARNING) << "update " << n << " refused: " << refused;
    ctx_.event("update",
               EventFields().add("id", int(n)).add("outcome", "refused").add("why", refused));
    active_ = -1;
    return;
  }
  if (plan_.mode() == report::lazy) {
    phase_ = Phase::kStaged;  // with the next recovery
    LOG(INFO) << "update " << n << " checked by every rank; it waits for the next recovery";
    ctx_.event("update", EventFields().add("id", int(n)).add("outcome", "staged"));
    return;
  }
  // A step every rank is still before.
  int64_t at = ahead + kApplyAhead;
  if (plan_.at_step() > at) at = plan_.at_step();
  decision.set_apply_before_step(at);
  set_message(*ctx_.store, keys::update_apply_key(n), decision);
  phase_ = Phase::kApplying;
}

bool UpdateManager::staged(membership::Rebuild* rb) const {
  if (active_ < 0 || phase_ != Phase::kStaged) return false;
  rb->set_plugin_path(plan_.plugin());
  rb->set_plugin_hash(plan_.hash());
  return true;
}

void UpdateManager::applied(int64_t step) {
  report::Update& u = plan_;
  set_outcome(report::applied);
  u.set_applied_step(step);
  u.set_applied_at(recovery::unix_now());
  last_applied_step_ = step;
  record(u);
  previous_version_ = plugin_version_;
  plugin_version_ = u.version();
  plugin_changed_ = true;
  set_current_plugin(u.plugin(), u.hash());
  phase_ = Phase::kProbation;
  LOG(INFO) << "update " << u.id() << " applied: " << u.version() << " (build " << u.hash()
            << ") from step " << step + 1 << "; on probation for "
            << ctx_.cfg().update().probation_steps() << " steps";
  ctx_.event("update", EventFields()
                           .add("id", u.id())
                           .add("outcome", "applied")
                           .add("step", double(step))
                           .add("plugin", u.plugin())
                           .add("hash", u.hash()));
  // The update is an incident of its own: who asked, which versions, when it took effect.
  report::Incident inc;
  inc.set_kind("update");
  inc.set_rank(-1);
  inc.set_slot(-1);
  inc.set_step(int(step));
  inc.set_detected_at(u.requested_at());
  inc.set_recovered_at(u.applied_at());
  inc.set_first_step_at(u.applied_at());
  inc.set_restored_step(int(step));
  inc.set_epoch(ctx_.members->epoch());
  inc.set_rung("update");
  inc.set_action(detail::concat("plugin ", u.previous_plugin(), " (build ", u.previous_hash(),
                                ") -> ", u.plugin(), " (", u.version(), ", build ", u.hash(),
                                ") at step ", step + 1, " (", report::UpdateMode_Name(u.mode()),
                                ")"));
  inc.set_detail("keel-ctl update");
  store_incident(ctx_, inc);
}

bool UpdateManager::in_probation(int64_t completed) const {
  return active_ >= 0 && phase_ == Phase::kProbation &&
         update::on_probation(plan_.applied_step(), completed,
                              ctx_.cfg().update().probation_steps());
}

void UpdateManager::end_probation(int64_t completed) {
  if (active_ >= 0 && phase_ == Phase::kProbation && !in_probation(completed))
    active_ = -1;  // it passed
}

bool UpdateManager::can_roll_back() const {
  return plan_.outcome() == report::applied && !plan_.previous_hash().empty();
}

void UpdateManager::rollback(Detected* d, membership::Rebuild* rb) {
  report::Update& u = plan_;
  const std::string why = d->found.detail();
  // Every rank goes back to the code before the update and to the state before it: the
  // snapshot of the step it was applied at.
  d->failure.restore_at_most = u.applied_step();
  rb->set_plugin_path(u.previous_plugin());
  rb->set_plugin_hash(u.previous_hash());
  plugin_version_ = previous_version_;
  set_current_plugin(u.previous_plugin(), u.previous_hash());
  set_outcome(report::rolled_back);
  u.set_why(why);
  record(u);
  d->found.set_detail(
      detail::concat("rollback of update ", u.id(), " (", u.plugin(), ") in probation: ", why));
  d->found.set_kind("rollback");
  ctx_.event("update",
             EventFields().add("id", u.id()).add("outcome", "rolled_back").add("why", why));
  LOG(WARNING) << "update " << u.id() << " rolled back to " << u.previous_plugin() << " (build "
               << u.previous_hash() << "): " << why;
  active_ = -1;
}

namespace {

// The manager's phases as the job's record names them, in Phase's order.
constexpr state::UpdateState::Phase kRecordedPhase[] = {
    state::UpdateState::checking, state::UpdateState::staged, state::UpdateState::applying,
    state::UpdateState::probation};

}  // namespace

state::UpdateState UpdateManager::to_proto() const {
  state::UpdateState s;
  if (active_ >= 0) {
    s.set_phase(kRecordedPhase[int(phase_)]);
    *s.mutable_plan() = plan_;
  }
  s.set_plugin_path(plugin_path_);
  s.set_plugin_hash(plugin_hash_);
  s.set_plugin_version(plugin_version_);
  s.set_previous_version(previous_version_);
  s.set_plugin_changed(plugin_changed_);
  s.set_last_applied_step(last_applied_step_);
  return s;
}

void UpdateManager::restore(const state::UpdateState& s) {
  plugin_path_ = s.plugin_path();
  plugin_hash_ = s.plugin_hash();
  plugin_version_ = s.plugin_version();
  previous_version_ = s.previous_version();
  plugin_changed_ = s.plugin_changed();
  last_applied_step_ = s.last_applied_step();
  plan_ = s.plan();
  active_ = s.phase() == state::UpdateState::none ? -1 : plan_.id();
  phase_ = Phase::kProbation;
  for (int p = 0; p < int(std::size(kRecordedPhase)); ++p)
    if (kRecordedPhase[p] == s.phase()) phase_ = Phase(p);
  // The ranks' checks are read again from the store; their deadline starts over.
  deadline_ = Clock::now() + kCheckTimeout;
  if (active_ >= 0)
    LOG(WARNING) << "update " << active_ << " (" << plan_.plugin()
                 << ") goes on under this leader (" << state::UpdateState::Phase_Name(s.phase())
                 << ")";
}

bool UpdateManager::published_by(int64_t command) const {
  const int64_t n = ctx_.store->add(keys::kUpdateCount, 0);
  for (int64_t i = n - 1; i >= 0; --i)
    if (auto u = try_get_message<report::Update>(*ctx_.store, keys::update_record_key(int(i))))
      if (u->command() == command) return true;
  return false;
}

std::string UpdateManager::progress_label() const {
  return !plugin_changed_ ? "" : " | plugin " + plugin_version_ + " " + plugin_hash_.substr(0, 8);
}

}  // namespace keel
