// Hot updates of the model's plugin, the controller's part (keel-ctl update; the ranks' part
// is launcher/worker/worker_update.cc). Two phases through the store: the plan goes out and every
// rank checks the new plugin against its state; if all fit, the controller picks a step ahead
// of every rank and each switches before it, else the update is refused and nothing changes.
// For update.probation_steps after that, a failure rolls the plugin back with the recovery
// (launcher/controller/controller_recovery.cc asks rollback_update()).
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "launcher/controller/controller_impl.h"
#include "model/plugin_loader.h"
#include "robust/update_probation.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// A rank that takes longer than this to check a plugin is refusing it.
constexpr std::chrono::seconds kCheckTimeout{30};

}  // namespace

void Controller::Impl::record_update(const report::Update& u) {
  store->set(keys::update_record_key(u.id()), u.SerializeAsString());
}

void Controller::Impl::publish_update(report::Update* u) {
  // The plan before the count: a rank that sees the count finds its plan.
  u->set_id(int(store->add(keys::kUpdateCount, 0)));
  record_update(*u);
  store->set(keys::update_key(u->id()), u->SerializeAsString());
  store->add(keys::kUpdateCount, 1);
}

void Controller::Impl::request_update(const control::UpdateRequest& rq, control::UpdateReply* r) {
  report::Update u;
  u.set_plugin(rq.plugin());
  u.set_requested_at(unix_now());
  u.set_applied_step(-1);
  u.set_at_step(rq.at_step());
  u.set_mode(rq.lazy() ? "lazy" : rq.at_step() > 0 ? "at_step" : "urgent");
  u.set_outcome("pending");
  if (update_active >= 0) {
    r->set_ok(false);
    r->set_message(detail::concat("update ", update_active, " is still in progress"));
    return;
  }
  if (plugin_hash.empty()) {
    // The job's plugin as configured, for the record and for a rollback.
    std::shared_ptr<Plugin> now = Plugin::load_copy(o.cfg.model().plugin());
    plugin_path = now->path();
    plugin_hash = now->hash();
    plugin_version = now->version();
  }
  u.set_previous_plugin(plugin_path);
  u.set_previous_hash(plugin_hash);
  try {
    // The controller loads it first: a file that is no plugin of this ABI is refused here,
    // before any rank spends a step on it.
    std::shared_ptr<Plugin> next = Plugin::load_copy(rq.plugin());
    u.set_hash(next->hash());
    u.set_version(next->name() + " " + next->version());
  } catch (const std::exception& e) {
    u.set_outcome("refused");
    u.set_why(e.what());
    // Published all the same, so that the ranks, which follow the plans in order, go past it.
    publish_update(&u);
    r->set_ok(false);
    r->set_id(u.id());
    r->set_message("refused: " + u.why());
    event("update", EventFields().add("id", u.id()).add("outcome", "refused").add("why", u.why()));
    return;
  }
  publish_update(&u);
  const int64_t n = u.id();
  update_active = int(n);
  update_phase = UpdatePhase::kChecking;
  update_deadline = Clock::now() + kCheckTimeout;
  update_plan = u;
  r->set_ok(true);
  r->set_id(int(n));
  r->set_message(detail::concat("update ", n, ": every rank checks ", rq.plugin(), " (build ",
                                u.hash(), ") against its state, then ",
                                rq.lazy() ? "it waits for the next recovery"
                                : rq.at_step() > 0
                                    ? detail::concat("switches before step ", rq.at_step() + 1)
                                    : std::string("switches at a step boundary"),
                                "; the outcome is in the report (updates)"));
  event("update_request",
        EventFields().add("id", int(n)).add("plugin", rq.plugin()).add("mode", u.mode()));
  LOG(INFO) << r->message();
}

void Controller::Impl::poll_updates() {
  if (update_active < 0) return;
  report::Update& u = update_plan;
  const int64_t n = update_active;
  if (update_phase == UpdatePhase::kChecking) {
    std::string refused;
    int checked = 0;
    for (int rk = 0; rk < world; ++rk) {
      try {
        const std::string v =
            store->get(keys::update_check_key(n, rk), std::chrono::milliseconds(1));
        ++checked;
        if (v != "ok" && refused.empty()) refused = v.substr(v.rfind("refused: ", 0) == 0 ? 9 : 0);
      } catch (const CommTimeout&) {
      }
    }
    if (checked < world && Clock::now() < update_deadline) return;
    if (checked < world && refused.empty())
      refused = detail::concat(world - checked, " rank(s) did not check the plugin within ",
                               kCheckTimeout.count(), " s");
    if (!refused.empty()) {
      store->set(keys::update_apply_key(n), "refused: " + refused);
      u.set_outcome("refused");
      u.set_why(refused);
      record_update(u);
      LOG(WARNING) << "update " << n << " refused: " << refused;
      event("update",
            EventFields().add("id", int(n)).add("outcome", "refused").add("why", refused));
      update_active = -1;
      return;
    }
    if (u.mode() == "lazy") {
      update_phase = UpdatePhase::kStaged;  // with the next recovery (recover())
      return;
    }
    // A step every rank is still before: ranks are within a step of each other (their
    // collectives hold them together), and reports lag by at most one.
    int64_t ahead = epoch_start_step;
    for (const auto& [rk, p] : progress) ahead = std::max<int64_t>(ahead, p.first.step());
    int64_t at = ahead + 3;
    if (u.at_step() > at) at = u.at_step();
    store->set(keys::update_apply_key(n), detail::concat("step ", at));
    update_phase = UpdatePhase::kApplying;
    return;
  }
  if (update_phase == UpdatePhase::kApplying) {
    int64_t step = -1;
    for (int rk = 0; rk < world; ++rk) {
      try {
        step = std::stoll(
            store->get(keys::update_applied_key(n, rk), std::chrono::milliseconds(1)));
      } catch (const CommTimeout&) {
        return;  // not every rank has switched yet
      }
    }
    applied_update(step);
  }
}

void Controller::Impl::applied_update(int64_t step) {
  report::Update& u = update_plan;
  u.set_outcome("applied");
  u.set_applied_step(step);
  u.set_applied_at(unix_now());
  ladder.update_applied_step = step;
  record_update(u);
  previous_version = plugin_version;
  plugin_path = u.plugin();
  plugin_hash = u.hash();
  plugin_version = u.version();
  plugin_changed = true;
  store->set(keys::kPluginCurrent, plugin_hash + " " + plugin_path);
  update_phase = UpdatePhase::kProbation;
  LOG(INFO) << "update " << u.id() << " applied: " << u.version() << " (build " << u.hash()
            << ") from step " << step + 1 << "; on probation for "
            << o.cfg.update().probation_steps() << " steps";
  event("update", EventFields()
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
  inc.set_epoch(epoch);
  inc.set_rung("update");
  inc.set_action(detail::concat("plugin ", u.previous_plugin(), " (build ", u.previous_hash(),
                                ") -> ", u.plugin(), " (", u.version(), ", build ", u.hash(),
                                ") at step ", step + 1, " (", u.mode(), ")"));
  inc.set_detail("keel-ctl update");
  const int64_t k = store->add(keys::kIncidentCount, 1) - 1;
  store->set(keys::incident_key(k), inc.SerializeAsString());
}

bool Controller::Impl::in_probation(int64_t completed) const {
  return update_active >= 0 && update_phase == UpdatePhase::kProbation &&
         update::on_probation(update_plan.applied_step(), completed,
                              o.cfg.update().probation_steps());
}

void Controller::Impl::end_probation(int64_t completed) {
  if (update_active >= 0 && update_phase == UpdatePhase::kProbation && !in_probation(completed))
    update_active = -1;  // it passed
}

void Controller::Impl::rollback_update(Detected* d, membership::Rebuild* rb) {
  report::Update& u = update_plan;
  const std::string why = d->inc.detail();
  // Every rank goes back to the code before the update and to the state before it: the
  // snapshot of the step it was applied at.
  d->failure.restore_at_most = u.applied_step();
  rb->set_plugin_path(u.previous_plugin());
  rb->set_plugin_hash(u.previous_hash());
  plugin_path = u.previous_plugin();
  plugin_hash = u.previous_hash();
  plugin_version = previous_version;
  store->set(keys::kPluginCurrent, plugin_hash + " " + plugin_path);
  u.set_outcome("rolled_back");
  u.set_why(why);
  record_update(u);
  d->inc.set_detail(
      detail::concat("rollback of update ", u.id(), " (", u.plugin(), ") in probation: ", why));
  d->inc.set_kind("rollback");
  event("update", EventFields().add("id", u.id()).add("outcome", "rolled_back").add("why", why));
  LOG(WARNING) << "update " << u.id() << " rolled back to " << u.previous_plugin() << " (build "
               << u.previous_hash() << "): " << why;
  update_active = -1;
}

}  // namespace keel
