// The one epoch transition (DESIGN.md, Recovery protocol), whatever the failure and whatever
// the plan: abort → ack → decide (robust/recovery_policy.h) → rebuild → restore. Crashes,
// hangs, lost slots, hot swaps, shrinking, growing back and restart_all all go through it,
// and it is the only place the membership's epoch, layout and placement change.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "ckpt/backup_placement.h"
#include "launcher/controller/controller_impl.h"
#include "launcher/controller/etcd_control_state.h"
#include "launcher/controller/incident.h"
#include "launcher/controller/job_state.h"
#include "launcher/recovery_protocol.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// Between looks at the acks, and between the policy's "wait"s.
constexpr std::chrono::milliseconds kAckPause{2};
constexpr std::chrono::milliseconds kWaitPause{10};
// The restore step of epoch 0's rebuild record: the job's start state, no restore.
constexpr int64_t kStartState = -2;

}  // namespace

policy::ClusterView Controller::Impl::view() {
  host->refresh();
  policy::ClusterView v = members.view();
  v.controller_slot = o.controller_slot;
  return v;
}

int64_t Controller::Impl::progress_now() const {
  const auto p = try_get_message<store::Step>(*store, keys::kProgress);
  return p ? p->step() : -1;
}

bool Controller::Impl::must_stop(const Detected& d, int64_t progress) {
  const policy::StopVerdict v =
      policy::count_failure(&stops, o.cfg.recovery().max_incidents(), progress);
  if (!v.stop) return false;
  if (stops.incidents > o.cfg.recovery().max_incidents())
    stop_why = detail::concat(v.why, " (last: ", d.found.detail(), ")");
  else
    stop_why = detail::concat(d.found.detail(), "; ", v.why);
  return true;
}

std::map<int, membership::Ack> Controller::Impl::collect_acks(int next, Detected* d) {
  std::map<int, membership::Ack> acks;
  // A healthy rank inside a long step answers at its end: the deadline scales with it.
  const int64_t ms = policy::abort_deadline_ms(o.cfg.recovery(), detector.median_step_s());
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (true) {
    pump();
    while (auto ex = host->poll_exit()) detector.fold_exit(d, *ex);
    // One read of every ack where the store can list keys (etcd: the same one call at
    // 16,384 ranks as at 8), else one read per ack still missing.
    if (std::optional<Store::KeyValues> got = store->try_get_prefix(keys::ack_prefix(next))) {
      for (const auto& [key, value] : *got) {
        const auto a = parse_message<membership::Ack>(key, value);
        if (a.rank() >= 0 && a.rank() < members.world()) acks[a.rank()] = a;
      }
    } else {
      for (int r = 0; r < members.world(); ++r) {
        if (d->failure.dead.count(r) || acks.count(r)) continue;
        if (auto a = try_get_message<membership::Ack>(*store, keys::ack_key(next, r))) acks[r] = *a;
      }
    }
    bool all = true;
    for (int r = 0; r < members.world(); ++r)
      if (!d->failure.dead.count(r) && !acks.count(r)) all = false;
    if (all) break;
    if (Clock::now() > deadline) {
      for (int r = 0; r < members.world(); ++r)
        if (!d->failure.dead.count(r) && !acks.count(r)) detector.fold_unanswered(d, r, ms);
      break;
    }
    std::this_thread::sleep_for(kAckPause);
  }
  return acks;
}

policy::LadderStep Controller::Impl::climb(Detected* d, int64_t progress,
                                           const std::map<int, policy::Holdings>& have,
                                           const policy::Options& po,
                                           membership::Rebuild* epoch_plugin) {
  const bool restart_all = o.cfg.recovery().mode() == config::RecoveryConfig::restart_all;
  ladder.update_applied_step = updates.last_applied_step();
  const policy::LadderStep ls = policy::climb(d->failure, progress, &ladder, po);
  if (ls.rung != policy::Rung::kCulprit) d->failure.ladder_why = ls.why;
  if (restart_all || ls.rung == policy::Rung::kCulprit) return ls;
  LOG(WARNING) << "ladder rung " << int(ls.rung) << " (" << policy::rung_name(ls.rung)
               << "): " << ls.why;
  ctx.event("ladder", EventFields().add("rung", int(ls.rung)).add("why", ls.why));
  switch (ls.rung) {
    case policy::Rung::kCulprit:
      break;
    case policy::Rung::kDiagnose: {
      std::set<int> suspects;
      const policy::ClusterView sv = view();
      for (const auto& [slot, st] : sv.slots)
        if (st == membership::SlotInfo::active && !sv.ranks_on(slot).empty()) suspects.insert(slot);
      for (int slot : diagnostics.run(suspects, stops.incidents, &d->found))
        d->failure.failed_slots.insert(slot);
      d->failure.diagnosed = true;
      break;
    }
    case policy::Rung::kRollback:
      if (!epoch_plugin->plugin_hash().empty()) break;  // probation rolled the plugin back
      if (ls.plugin_rollback && updates.can_roll_back())
        updates.rollback(d, epoch_plugin);
      else
        d->failure.from_checkpoint = true;
      break;
    case policy::Rung::kReplay:
      // The replay names a machine: a rank of it is the culprit, and its slot goes.
      replays.pin(d, have, stops.incidents);
      if (d->failure.kind != policy::FailureKind::kSdc && d->failure.culprit >= 0)
        d->failure.failed_slots.insert(host->slot_of(d->failure.culprit));
      break;
  }
  return ls;
}

std::optional<policy::Plan> Controller::Impl::decide(Detected* d,
                                                     const std::map<int, policy::Holdings>& have,
                                                     const policy::Options& po) {
  const auto wait_start = Clock::now();
  policy::Plan plan;
  policy::ClusterView v;
  while (true) {
    v = view();
    // Slots found lost since the failure was detected (a restart_all kills first, asks after).
    for (const auto& [k, st] : v.slots)
      if (st == membership::SlotInfo::lost && !v.ranks_on(k).empty() &&
          !d->failure.lost_slots.count(k)) {
        d->failure.lost_slots.insert(k);
        for (int r : v.ranks_on(k)) d->failure.dead.insert(r);
      }
    // Every wait for a standby is bounded: past recovery.standby_wait_ms the policy decides
    // without one (a standby still checking itself is left out, and on_no_standby = wait
    // stops), and says so.
    const auto bound = std::chrono::milliseconds(o.cfg.recovery().standby_wait_ms());
    v.standby_wait_over = state == RunState::kWaiting && Clock::now() - wait_start > bound;
    plan = policy::decide(d->failure, v, have, po);
    if (plan.kind != policy::Plan::Kind::kWait) {
      if (v.standby_wait_over) {
        const std::string why = detail::concat(
            "waited recovery.standby_wait_ms = ", bound.count(), " ms for a standby: ",
            plan.kind == policy::Plan::Kind::kStop ? "stopping: " + plan.why : plan.action);
        LOG(WARNING) << why;
        ctx.event("wait_over", EventFields().add("why", why));
      }
      break;
    }
    if (state != RunState::kWaiting) {
      const std::string why =
          plan.waits_for_standby
              ? detail::concat(plan.why, " (at most recovery.standby_wait_ms = ", bound.count(),
                               " ms)")
              : plan.why;
      LOG(WARNING) << why;
      ctx.event("wait", EventFields().add("why", why));
    }
    state = RunState::kWaiting;
    if (stopping()) return std::nullopt;
    pump();
    while (auto ex = host->poll_exit()) d->failure.dead.insert(ex->rank);
    std::this_thread::sleep_for(kWaitPause);
  }
  if (state == RunState::kWaiting)
    for (int k : d->failure.lost_slots)
      if (v.slots.count(k) && v.slots.at(k) != membership::SlotInfo::lost) {
        LOG(INFO) << "slot " << k << " is back";
        ctx.event("slot_rejoined", EventFields().add("slot", k));
      }
  return plan;
}

bool Controller::Impl::recover(Detected d) {
  // Nothing is decided or done (an abort, a stop, a kill) by a controller that another has
  // replaced: one cut off from etcd and back sees every slot silent, and would act on that
  // (Deposed ends it here; without quorum it waits, as every decision does).
  if (o.state) o.state->check_leading();
  ctx.event("detected", EventFields()
                            .add("kind", d.found.kind())
                            .add("rank", d.failure.culprit_is_machine ? -1 : d.failure.culprit)
                            .add("rule", d.failure.rule)
                            .add("detail", d.found.detail()));
  const int64_t progress = progress_now();
  // An operator's replay is a check, not a failure: it counts against no stop rule.
  const bool requested = d.failure.rule == ReplayCoordinator::kRequestedRule;
  if (!requested && must_stop(d, progress)) return false;
  state = RunState::kRecovering;
  const uint64_t etcd_writes = o.state ? o.state->writes() : 0;  // this recovery's, measured
  const int next = members.epoch() + 1;
  const bool restart_all = o.cfg.recovery().mode() == config::RecoveryConfig::restart_all;

  // 1-2. Abort and ack: survivors abort their communicators and say what they hold.
  std::map<int, membership::Ack> acks;
  if (restart_all) {
    host->stop_all(SIGKILL, std::chrono::milliseconds(0));
  } else {
    store::Abort abort;
    abort.set_reason(d.found.detail());
    set_message(*store, keys::abort_key(next), abort);
    ctx.event("abort", EventFields().add("epoch", next));
    acks = collect_acks(next, &d);
  }

  // A failure while an update is on probation rolls the plugin back with the recovery; a
  // lazy update staged for a recovery goes in with this one.
  membership::Rebuild epoch_plugin;
  bool lazy_update = false;
  if (updates.in_probation(progress) && !restart_all)
    updates.rollback(&d, &epoch_plugin);
  else
    lazy_update = updates.staged(&epoch_plugin);

  // 3. Decide: the ladder's mechanism first (restart_all, the baseline, only restarts).
  const policy::Options po = ctx.policy_options(/*with_checkpoint=*/true);
  std::map<int, policy::Holdings> have =
      host->survey(members.topo(), replicas_hold_backups(members.topo(), po.zero1));
  for (const auto& [r, a] : acks) have[r].live = a.steps_completed();
  const policy::LadderStep ls = climb(&d, progress, have, po, &epoch_plugin);
  const std::optional<policy::Plan> plan = decide(&d, have, po);
  if (!plan) return false;
  if (plan->kind == policy::Plan::Kind::kStop) {
    stop_why = detail::concat(d.found.detail(), "; ", plan->why);
    ctx.event("stop_decision", EventFields().add("why", plan->why));
    return false;
  }

  // 4. Rebuild: carry the plan out under the next epoch.
  Transition t;
  t.ladder_rung = int(ls.rung);
  for (const auto& [r, a] : acks) {
    t.step_in_flight = std::max(t.step_in_flight, a.step_in_flight());
    t.steps_completed = std::max(t.steps_completed, a.steps_completed());
  }
  if (restart_all) t.step_in_flight = t.steps_completed = std::max<int64_t>(progress, 0);
  const std::optional<report::Incident> recorded =
      carry_out(*plan, next, &t, epoch_plugin.plugin_hash().empty() ? nullptr : &epoch_plugin,
                d.failure.replay_cleared ? nullptr : &d);
  if (lazy_update) updates.applied(std::max<int64_t>(plan->restore.step, 0));
  if (!recorded) {
    LOG(WARNING) << "replay: no machine computes wrong; the job goes on from step "
                 << plan->restore.step << " (epoch " << members.epoch() << ")";
    ctx.event("replay_cleared",
              EventFields().add("epoch", members.epoch()).add("step", plan->restore.step));
    return true;
  }
  const report::Incident& inc = *recorded;
  LOG(WARNING) << "incident " << t.incident + 1 << ": " << inc.detail() << " at step "
               << inc.step() + 1 << "; " << inc.action() << " (epoch " << members.epoch()
               << ", restored step " << inc.restored_step() << ")";
  if (!plan->restore.why.empty())
    LOG(INFO) << "restored from " << inc.restored_from() << ": " << plan->restore.why;
  ctx.event("recovered", EventFields()
                             .add("kind", inc.kind())
                             .add("epoch", members.epoch())
                             .add("restored_step", inc.restored_step())
                             .add("restored_from", inc.restored_from())
                             .add("rung", inc.rung())
                             .add("action", inc.action())
                             .add("etcd_writes", o.state ? o.state->writes() - etcd_writes : 0));
  return true;
}

void Controller::Impl::apply_membership(const policy::Plan& plan, Transition* t) {
  for (int r : plan.kill) host->kill(r);
  const policy::ClusterView before = view();
  for (int s : plan.evict) {
    auto st = before.slots.find(s);
    // A live slot (hung, over-evicted) drops its workers and checks itself again.
    if (st != before.slots.end() && st->second == membership::SlotInfo::active) {
      members.evict(s);
      host->evict(s);
    }
  }
  if (!plan.evict.empty()) t->evicted_at = recovery::unix_now();
  host->refresh();
  for (const auto& [s, sb] : plan.promote) {
    const std::vector<int> moved = members.promote(s, sb);
    for (size_t i = 0; i < moved.size(); ++i) host->adopt(moved[i], int(i));
    LOG(WARNING) << "slot " << s << " evicted; standby slot " << sb << " takes its ranks";
    ctx.event("promote", EventFields().add("evicted", s).add("standby", sb));
  }
  if (!plan.next_topo) return;
  const int dp_before = members.topo().dp();
  members.renumber(plan.renumber, *plan.next_topo);
  host->renumber(plan.renumber, plan.next_topo->world_size());
  for (int s : plan.retire_slots) {  // they check themselves: standbys
    members.evict(s);
    host->evict(s);
  }
  if (plan.rung == policy::PlanRung::kShrink)
    LOG(WARNING) << plan.why << ": data parallelism shrinks from " << dp_before << " to "
                 << plan.next_topo->dp() << " replicas (" << plan.action << ")";
  if (plan.rung == policy::PlanRung::kReshape) {
    LOG(WARNING) << plan.why << ": " << plan.action;
    ctx.event("reshape", EventFields()
                             .add("tp", plan.next_topo->tp())
                             .add("pp", plan.next_topo->pp())
                             .add("dp", plan.next_topo->dp()));
  } else {
    ctx.event(plan.rung == policy::PlanRung::kGrow ? "grow_dp" : "shrink_dp",
              EventFields().add("dp", plan.next_topo->dp()));
  }
  if (plan.new_ranks.empty()) return;
  host->refresh();
  if (members.placeable() < int(plan.new_ranks.size())) {
    LOG(WARNING) << "growing back: the standbys went away";
    return;
  }
  for (const JobMembership::Placement& p : members.place(plan.new_ranks))
    host->adopt(p.rank, p.index);
}

int64_t Controller::Impl::write_rebuild(const policy::Plan& plan, const membership::Rebuild* plugin,
                                        const Topology* before, const report::Incident* inc) {
  membership::Rebuild rb;
  *rb.mutable_membership() = members.to_proto();
  rb.set_restore_step(members.epoch() == 0 ? kStartState : plan.restore.step);
  rb.set_source(plan.restore.job_source);
  for (const auto& [a, b] : plan.renumber) (*rb.mutable_renumber())[a] = b;
  for (int r : plan.new_ranks) rb.add_new_ranks(r);
  if (plan.rung == policy::PlanRung::kReshape && before) {
    rb.mutable_reshard_from()->set_tp(before->tp());
    rb.mutable_reshard_from()->set_pp(before->pp());
    rb.mutable_reshard_from()->set_dp(before->dp());
  }
  rb.set_checkpoint_dir(o.cfg.checkpoint().dir());
  if (plugin) {
    rb.set_plugin_path(plugin->plugin_path());
    rb.set_plugin_hash(plugin->plugin_hash());
  }
  transition = rb;
  // etcd first, the whole record in one fenced write: the epoch a next leader finds is never
  // behind the one the ranks were told, and it comes with the decisions' memory that chose it
  // and its incident. Only the leader writes incidents during a transition (the ranks are
  // aborted), so the count read here is the index the record takes.
  const int64_t n = inc ? next_incident(ctx) : -1;
  if (o.state) {
    const state::JobState js = job_state();
    std::vector<std::pair<std::string, std::string>> with;
    if (inc) with.push_back(o.state->incident_entry(n, *inc));
    o.state->job_state(js, with);
    recorded_state = job_state_key(js);
  }
  if (inc) count_incident(ctx, n, *inc);
  set_message(*store, keys::rebuild_key(members.epoch()), rb);
  return n;
}

state::JobState Controller::Impl::job_state() const {
  state::JobState js;
  *js.mutable_membership() = members.to_proto();
  *js.mutable_transition() = transition;
  *js.mutable_stops() = stop_counts(stops);
  *js.mutable_ladder() = ladder_record(ladder);
  *js.mutable_update() = updates.to_proto();
  js.set_commands(commands);
  js.set_commands_done(commands_done);
  return js;
}

void Controller::Impl::record_job_state() {
  // Mid-transition the membership is half changed: the transition writes the record itself.
  if (!o.state || state != RunState::kTraining) return;
  const state::JobState js = job_state();
  std::string key = job_state_key(js);
  if (key == recorded_state) return;
  o.state->job_state(js);
  recorded_state = std::move(key);
}

std::optional<report::Incident> Controller::Impl::carry_out(const policy::Plan& plan, int next,
                                                            Transition* t,
                                                            const membership::Rebuild* plugin,
                                                            const Detected* d) {
  const Topology before = members.topo();
  apply_membership(plan, t);
  members.next_epoch(next);
  for (int r : plan.restart) spawn(r, /*restarted=*/true);
  t->epoch = next;
  t->rebuilt_at = recovery::unix_now();
  std::optional<report::Incident> inc;
  if (d) inc = incident_of(*d, plan, *t);
  t->incident = write_rebuild(plan, plugin, &before, inc ? &*inc : nullptr);
  // Three epochs back: a rank restarted for epoch next-1 may still be starting and read its
  // rebuild; none is left in next-3, whose ranks all acked a later epoch.
  forget_epoch(next - 3);
  ctx.event("rebuild",
            EventFields().add("epoch", next).add("restore_step", double(plan.restore.step)));
  detector.new_epoch(plan.restore.step);
  slow.reset();
  state = RunState::kTraining;
  return inc;
}

void Controller::Impl::maybe_grow() {
  // Growing back restores from the survivors' memory, never a checkpoint.
  const policy::Options po = ctx.policy_options(/*with_checkpoint=*/false);
  if (!policy::can_grow(view(), po)) return;
  Detected d;
  d.found.set_detected_at(recovery::unix_now());
  d.found.set_kind("grow");
  d.found.set_detail(po.recovery.on_no_standby() == config::RecoveryConfig::reshape
                         ? "grow back to a larger layout"
                         : "grow data parallelism");
  const int next = members.epoch() + 1;
  store::Abort abort;
  abort.set_reason(d.found.detail());
  set_message(*store, keys::abort_key(next), abort);
  std::map<int, membership::Ack> acks = collect_acks(next, &d);
  std::map<int, policy::Holdings> have;
  for (const auto& [r, a] : acks) have[r].live = a.steps_completed();
  std::optional<policy::Plan> plan = policy::decide_grow(view(), have, po);
  if (!plan || !d.failure.dead.empty()) {
    // The ranks are aborted already: go on in the next epoch as they are.
    policy::Plan same;
    same.rung = policy::PlanRung::kReattempt;
    same.action = "growing back failed: reattempt in place";
    same.restore = policy::restore_point(have, members.world(), -1, false);
    same.restart = d.failure.dead;
    Transition t;
    carry_out(same, next, &t);
    return;
  }
  Transition t;
  carry_out(*plan, next, &t);
  if (plan->rung == policy::PlanRung::kReshape)
    LOG(INFO) << plan->action << " (epoch " << members.epoch() << ", step " << plan->restore.step
              << ")";
  else
    LOG(INFO) << "data parallelism grows back to " << members.topo().dp() << " replicas (epoch "
              << members.epoch() << ", step " << plan->restore.step << ")";
}

void Controller::Impl::forget_epoch(int e) {
  if (e < 0) return;
  store->erase({keys::abort_key(e), keys::errors_key(e), keys::rebuild_key(e),
                keys::sdc_verdict_key(e), keys::update_failure_key(e)},
               {keys::epoch_prefix(e), keys::ack_prefix(e), keys::error_prefix(e),
                keys::backup_addr_prefix(e)});
}

}  // namespace keel
