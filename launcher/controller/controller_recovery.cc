// The one epoch transition (DESIGN.md, Recovery protocol), whatever the failure and whatever
// the plan: abort → ack → decide (robust/recovery_policy.h) → rebuild → restore. Crashes,
// hangs, lost slots, hot swaps, shrinking, growing back and restart_all all go through it.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "ckpt/backup_placement.h"
#include "ckpt/persistent_checkpoint.h"
#include "launcher/controller/controller_impl.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// A standby still checking itself is worth this long a wait before the policy is asked
// again as if it were not there.
constexpr std::chrono::seconds kStandbyCheckWait{30};

}  // namespace

policy::ClusterView Controller::Impl::view() const {
  policy::ClusterView v;
  v.topo = topo;
  v.configured_dp = o.cfg.parallel().dp();
  host->fill_view(&v);
  return v;
}

policy::Options Controller::Impl::policy_options(bool with_checkpoint) const {
  policy::Options po;
  po.recovery = o.cfg.recovery();
  po.detect = o.cfg.detect();
  po.zero1 = o.cfg.parallel().zero1();
  po.micro_batch = o.cfg.train().micro_batch_size();
  po.global_batch = o.cfg.train().global_batch_size();
  const auto& ck = o.cfg.checkpoint();
  if (with_checkpoint && ck.persistent_every_steps() > 0) {
    CheckpointLayout l;
    l.tp = topo.tp();
    l.pp = topo.pp();
    l.dp = topo.dp();
    l.zero1 = o.cfg.parallel().zero1();
    l.lineage = o.lineage;  // never a newer checkpoint another run left in the directory
    try {
      po.persistent_step = find_resume_point(ck.dir(), l).step;
    } catch (const InputError&) {
      po.persistent_step = -1;  // none yet, or none complete
    }
  }
  return po;
}

void Controller::Impl::update_membership() {
  members.Clear();
  members.set_epoch(epoch);
  members.set_tp(topo.tp());
  members.set_pp(topo.pp());
  members.set_dp(topo.dp());
  const policy::ClusterView v = view();
  for (int s : v.rank_slot) members.add_rank_slot(s);
  for (const auto& [k, st] : v.slots) {
    membership::SlotInfo* si = members.add_slots();
    si->set_slot(k);
    si->set_state(st);
    si->set_ready(v.ready_standbys.count(k) > 0);
  }
}

std::map<int, membership::Ack> Controller::Impl::collect_acks(int next, Detected* d) {
  report::Incident* inc = &d->inc;
  std::map<int, membership::Ack> acks;
  // A healthy rank inside a long step answers at its end: the deadline scales with it.
  const int64_t ms = policy::abort_deadline_ms(o.cfg.recovery(), median_step_s());
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (true) {
    pump();
    while (auto ex = host->poll_exit()) {
      d->failure.dead.insert(ex->rank);
      // A peer's communication error was seen before this exit: the exit names the culprit.
      if (inc->kind() == "comm_error" && !ex->slot_lost && !ex->clean()) {
        inc->set_rank(ex->rank);
        inc->set_slot(host->slot_of(ex->rank));
        inc->set_kind(WIFSIGNALED(ex->status) ? "crash" : "exit");
        inc->set_rule("exit");
        d->failure.kind =
            WIFSIGNALED(ex->status) ? policy::FailureKind::kCrash : policy::FailureKind::kExit;
        d->failure.culprit = ex->rank;
      }
      if (ex->slot_lost && !d->failure.lost_slots.count(ex->slot)) label_slot_loss(d, ex->slot);
      inc->set_detail(inc->detail() + detail::concat("; rank ", ex->rank, " ", ex->describe()));
    }
    bool all = true;
    for (int r = 0; r < world; ++r) {
      if (d->failure.dead.count(r) || acks.count(r)) continue;
      try {
        membership::Ack a;
        if (a.ParseFromString(store->get(keys::ack_key(next, r), std::chrono::milliseconds(1))))
          acks[r] = a;
      } catch (const CommTimeout&) {
        all = false;
      }
    }
    if (all) break;
    if (Clock::now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (d->failure.dead.count(r) || acks.count(r)) continue;
        host->kill(r);
        d->failure.dead.insert(r);
        if (inc->rank() < 0 || inc->kind() == "comm_error") {
          inc->set_rank(r);
          inc->set_slot(host->slot_of(r));
          inc->set_kind("hang");
          inc->set_rule("abort_deadline");
          d->failure.kind = policy::FailureKind::kHang;
          d->failure.culprit = r;
        }
        inc->set_detail(inc->detail() + detail::concat("; rank ", r,
                                                       " did not answer the abort within ", ms,
                                                       " ms (hung): killed"));
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return acks;
}

bool Controller::Impl::recover(Detected d) {
  report::Incident& inc = d.inc;
  event("detected", EventFields()
                        .add("kind", inc.kind())
                        .add("rank", inc.rank())
                        .add("rule", inc.rule())
                        .add("detail", inc.detail()));
  if (++incidents > o.cfg.recovery().max_incidents()) {
    LOG(ERROR) << incidents << " incidents, more than recovery.max_incidents = "
               << o.cfg.recovery().max_incidents() << "; stopping the job (last: " << inc.detail()
               << ")";
    return false;
  }
  // A failure that comes back before the job completed a single step since the last one
  // will not go away by restarting (every rank failing to connect, say): stop.
  int64_t progress_now = -1;
  try {
    progress_now = std::stoll(store->get("progress", std::chrono::milliseconds(1)));
  } catch (const std::exception&) {
  }
  no_progress_incidents = progress_now == progress_at_last_incident ? no_progress_incidents + 1 : 0;
  progress_at_last_incident = progress_now;
  if (no_progress_incidents >= 2) {
    LOG(ERROR) << inc.detail() << "; the job completed no step since the last "
               << no_progress_incidents << " recoveries, so this failure repeats: stopping the job";
    return false;
  }
  state = "recovering";
  const int next = epoch + 1;
  const bool restart_all = o.cfg.recovery().mode() == config::RecoveryConfig::restart_all;

  // 1-2. Abort and ack: survivors abort their communicators and say what they hold.
  std::map<int, membership::Ack> acks;
  if (restart_all) {
    host->stop_all(SIGKILL, std::chrono::milliseconds(0));
  } else {
    store->set(keys::abort_key(next), inc.detail());
    event("abort", EventFields().add("epoch", next));
    acks = collect_acks(next, &d);
  }

  // A failure while an update is on probation rolls the plugin back with the recovery; a
  // lazy update staged for a recovery goes in with this one.
  membership::Rebuild epoch_plugin;
  bool lazy_update = false;
  if (in_probation(progress_now) && !restart_all) {
    rollback_update(&d, &epoch_plugin);
  } else if (update_active >= 0 && update_phase == UpdatePhase::kStaged) {
    epoch_plugin.set_plugin_path(update_plan.plugin());
    epoch_plugin.set_plugin_hash(update_plan.hash());
    lazy_update = true;
  }

  // 3. Decide.
  const policy::Options po = policy_options(/*with_checkpoint=*/true);
  std::map<int, policy::Holdings> have = host->survey(topo, replicas_hold_backups(topo, po.zero1));
  for (const auto& [r, a] : acks) have[r].live = a.steps_completed();
  // The ladder: a failure with no clear culprit runs diagnostics, a rollback or a replay
  // before the decision (restart_all, the baseline, only restarts).
  const policy::LadderStep ls = policy::climb(d.failure, progress_now, &ladder, po);
  inc.set_ladder_rung(int(ls.rung));
  if (ls.rung != policy::Rung::kCulprit) d.failure.ladder_why = ls.why;
  if (!restart_all && ls.rung != policy::Rung::kCulprit) {
    LOG(WARNING) << "ladder rung " << int(ls.rung) << " (" << policy::rung_name(ls.rung)
                 << "): " << ls.why;
    event("ladder", EventFields().add("rung", int(ls.rung)).add("why", ls.why));
  }
  if (!restart_all) switch (ls.rung) {
      case policy::Rung::kCulprit:
        break;
      case policy::Rung::kDiagnose: {
        std::set<int> suspects;
        const policy::ClusterView sv = view();
        for (const auto& [slot, st] : sv.slots)
          if (st == membership::SlotInfo::active && !sv.ranks_on(slot).empty())
            suspects.insert(slot);
        for (int slot : diagnose(suspects, &inc)) d.failure.failed_slots.insert(slot);
        d.failure.diagnosed = true;
        break;
      }
      case policy::Rung::kRollback:
        if (!epoch_plugin.plugin_hash().empty()) break;  // probation rolled the plugin back
        if (ls.plugin_rollback && update_plan.outcome() == "applied" &&
            !update_plan.previous_hash().empty())
          rollback_update(&d, &epoch_plugin);
        else
          d.failure.from_checkpoint = true;
        break;
      case policy::Rung::kReplay: {
        // The replay names a machine: a rank of it is the culprit, and its slot goes.
        pin_by_replay(&d, have);
        if (d.failure.kind != policy::FailureKind::kSdc && d.failure.culprit >= 0)
          d.failure.failed_slots.insert(host->slot_of(d.failure.culprit));
        break;
      }
    }
  const auto wait_start = Clock::now();
  policy::Plan plan;
  policy::ClusterView v;
  while (true) {
    v = view();
    // Slots found lost since the failure was detected (a restart_all kills first, asks after).
    for (const auto& [k, st] : v.slots)
      if (st == membership::SlotInfo::lost && !v.ranks_on(k).empty() &&
          !d.failure.lost_slots.count(k)) {
        d.failure.lost_slots.insert(k);
        for (int r : v.ranks_on(k)) d.failure.dead.insert(r);
      }
    if (Clock::now() - wait_start > kStandbyCheckWait) v.pending_standbys.clear();
    plan = policy::decide(d.failure, v, have, po);
    if (plan.kind != policy::Plan::Kind::kWait) break;
    if (state != "waiting") {
      LOG(WARNING) << plan.why;
      event("wait", EventFields().add("why", plan.why));
    }
    state = "waiting";
    if (stopping()) return false;
    pump();
    while (auto ex = host->poll_exit()) d.failure.dead.insert(ex->rank);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (state == "waiting")
    for (int k : d.failure.lost_slots)
      if (v.slots.count(k) && v.slots.at(k) != membership::SlotInfo::lost) {
        LOG(INFO) << "slot " << k << " is back";
        event("slot_rejoined", EventFields().add("slot", k));
      }
  if (plan.kind == policy::Plan::Kind::kStop) {
    LOG(ERROR) << inc.detail() << "; " << plan.why << ": stopping the job";
    event("stop_decision", EventFields().add("why", plan.why));
    return false;
  }

  // 4. Rebuild: carry the plan out under the next epoch.
  int64_t in_flight = 0, completed = 0;
  for (const auto& [r, a] : acks) {
    in_flight = std::max(in_flight, a.step_in_flight());
    completed = std::max(completed, a.steps_completed());
  }
  if (restart_all) in_flight = completed = std::max<int64_t>(progress_now, 0);
  carry_out(plan, next, &inc, epoch_plugin.plugin_hash().empty() ? nullptr : &epoch_plugin);
  if (lazy_update) applied_update(std::max<int64_t>(plan.restore.step, 0));
  if (ls.rung != policy::Rung::kCulprit && !restart_all && plan.why != ls.why)
    inc.set_why(ls.why + " -> " + plan.why);
  inc.set_step(int(in_flight));
  inc.set_steps_lost(
      int(std::max<int64_t>(0, completed - std::max<int64_t>(plan.restore.step, 0))));
  const int64_t n = store->add(keys::kIncidentCount, 1) - 1;
  store->set(keys::incident_key(n), inc.SerializeAsString());
  LOG(WARNING) << "incident " << n + 1 << ": " << inc.detail() << " at step " << inc.step() + 1
               << "; " << inc.action() << " (epoch " << epoch << ", restored step "
               << inc.restored_step() << ")";
  if (!plan.restore.why.empty())
    LOG(INFO) << "restored from " << inc.restored_from() << ": " << plan.restore.why;
  event("recovered", EventFields()
                         .add("kind", inc.kind())
                         .add("epoch", epoch)
                         .add("restored_step", inc.restored_step())
                         .add("restored_from", inc.restored_from())
                         .add("rung", inc.rung())
                         .add("action", inc.action()));
  return true;
}

void Controller::Impl::carry_out(const policy::Plan& plan, int next, report::Incident* inc,
                                 const membership::Rebuild* plugin) {
  for (int r : plan.kill) host->kill(r);
  const policy::ClusterView before = view();
  for (int s : plan.evict) {
    auto st = before.slots.find(s);
    // A live slot (hung, over-evicted) drops its workers and checks itself again.
    if (st != before.slots.end() && st->second == membership::SlotInfo::active) host->evict(s);
  }
  if (!plan.evict.empty()) inc->set_evicted_at(unix_now());
  for (const auto& [s, sb] : plan.promote) {
    KEEL_CHECK(host->promote(s, sb), "standby slot ", sb, " is no longer ready");
    inc->add_slots_evicted(s);
    inc->add_standbys_promoted(sb);
    LOG(WARNING) << "slot " << s << " evicted; standby slot " << sb << " takes its ranks";
    event("promote", EventFields().add("evicted", s).add("standby", sb));
  }
  if (plan.next_topo) {
    host->renumber(plan.renumber, plan.next_topo->world_size());
    for (int s : plan.retire_slots) host->evict(s);  // they check themselves: standbys
    if (plan.rung == "shrink")
      LOG(WARNING) << plan.why << ": data parallelism shrinks from " << topo.dp() << " to "
                   << plan.next_topo->dp() << " replicas (" << plan.action << ")";
    event(plan.rung == "grow" ? "grow_dp" : "shrink_dp",
          EventFields().add("dp", plan.next_topo->dp()));
    topo = *plan.next_topo;
    world = topo.world_size();
    if (!plan.new_ranks.empty() && !host->place(plan.new_ranks))
      LOG(WARNING) << "growing back: the standbys went away";
  }
  epoch = next;
  update_membership();
  for (int r : plan.restart) spawn(r, /*restarted=*/true);
  membership::Rebuild rb;
  *rb.mutable_membership() = members;
  rb.set_restore_step(plan.restore.step);
  rb.set_source(plan.restore.job_source);
  for (const auto& [a, b] : plan.renumber) (*rb.mutable_renumber())[a] = b;
  for (int r : plan.new_ranks) rb.add_new_ranks(r);
  rb.set_checkpoint_dir(o.cfg.checkpoint().dir());
  if (plugin) {
    rb.set_plugin_path(plugin->plugin_path());
    rb.set_plugin_hash(plugin->plugin_hash());
  }
  store->set(keys::rebuild_key(next), rb.SerializeAsString());
  // Three epochs back: a rank restarted for epoch next-1 may still be starting and read its
  // rebuild; none is left in next-3, whose ranks all acked a later epoch.
  forget_epoch(next - 3);
  inc->set_rebuilt_at(unix_now());
  event("rebuild", EventFields().add("epoch", next).add("restore_step", double(plan.restore.step)));
  inc->set_epoch(next);
  inc->set_restored_step(int(plan.restore.step));
  inc->set_action(plan.action);
  inc->set_rung(plan.rung);
  inc->set_why(plan.why);
  inc->set_restored_from(plan.restore.job_source == membership::persistent ? "persistent"
                         : plan.restore.job_source == membership::scratch  ? "scratch"
                                                                           : "memory");
  inc->set_why_not_memory(plan.restore.why);
  progress.clear();
  rounds.clear();
  judged_round = -1;
  warned_slow.clear();
  slow_detector.reset();
  slowest_rank = -1;
  epoch_start_step = std::max<int64_t>(0, plan.restore.step);
  last_min_step = -1;
  last_advance = Clock::now();
  state = "training";
}

void Controller::Impl::maybe_grow() {
  // Growing back restores from the survivors' memory, never a checkpoint.
  const policy::Options po = policy_options(/*with_checkpoint=*/false);
  if (!policy::can_grow(view(), po)) return;
  Detected d;
  d.inc.set_detected_at(unix_now());
  d.inc.set_kind("grow");
  d.inc.set_rank(-1);
  d.inc.set_detail("grow data parallelism");
  const int next = epoch + 1;
  store->set(keys::abort_key(next), "grow data parallelism");
  std::map<int, membership::Ack> acks = collect_acks(next, &d);
  std::map<int, policy::Holdings> have;
  for (const auto& [r, a] : acks) have[r].live = a.steps_completed();
  std::optional<policy::Plan> plan = policy::decide_grow(view(), have, po);
  if (!plan || !d.failure.dead.empty()) {
    // The ranks are aborted already: go on in the next epoch as they are.
    policy::Plan same;
    same.rung = "reattempt";
    same.action = "growing back failed: reattempt in place";
    same.restore = policy::restore_point(have, world, -1, false);
    same.restart = d.failure.dead;
    carry_out(same, next, &d.inc);
    return;
  }
  carry_out(*plan, next, &d.inc);
  LOG(INFO) << "data parallelism grows back to " << topo.dp() << " replicas (epoch " << epoch
            << ", step " << plan->restore.step << ")";
}

void Controller::Impl::forget_epoch(int e) {
  if (e < 0) return;
  const std::string n = std::to_string(e);
  store->erase({keys::abort_key(e), keys::errors_key(e), keys::rebuild_key(e),
                keys::sdc_verdict_key(e), keys::update_failure_key(e)},
               {n + "/", "ack/" + n + "/", "error/" + n + "/", "backup_addr/" + n + "/"});
}

}  // namespace keel
