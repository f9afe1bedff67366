#include "robust/recovery_policy.h"

#include <algorithm>
#include <cmath>

#include "ckpt/backup_placement.h"
#include "robust/reshape_plan.h"
#include "runtime/check.h"

namespace keel::policy {
namespace {

using SlotState = membership::SlotInfo::State;

std::string join(const std::set<int>& xs) {
  std::string out;
  for (int x : xs) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return out;
}

std::string plural(const char* noun, size_t n) {
  return std::string(noun) + (n == 1 ? " " : "s ");
}

bool lost(const ClusterView& v, int slot) {
  auto it = v.slots.find(slot);
  return it != v.slots.end() && it->second == membership::SlotInfo::lost;
}

Plan stop(std::string why) {
  Plan p;
  p.kind = Plan::Kind::kStop;
  p.why = std::move(why);
  return p;
}

Plan wait(std::string why) {
  Plan p;
  p.kind = Plan::Kind::kWait;
  p.why = std::move(why);
  return p;
}

// A wait for a standby: bounded by recovery.standby_wait_ms (the controller then decides
// again with standby_wait_over).
Plan wait_for_standby(std::string why) {
  Plan p = wait(std::move(why));
  p.waits_for_standby = true;
  return p;
}

// Why a job that waited for a standby for slot `s`'s ranks stops.
std::string no_standby_within(int s, const Options& o) {
  return detail::concat("slot ", s, " is out and no standby was ready within ",
                        "recovery.standby_wait_ms = ", o.recovery.standby_wait_ms(),
                        " ms (recovery.on_no_standby = wait)");
}

// What each rank can really restore from once the plan is carried out: a restarted rank has
// no live state, a rank moved to another slot cannot read its old slot's snapshot, and a
// backup is gone with its holder's lost or evicted slot.
std::map<int, Holdings> usable(const std::map<int, Holdings>& have, const Topology& topo,
                               const ClusterView& v, const std::set<int>& restart,
                               const std::set<int>& moved, const std::set<int>& gone_slots,
                               bool replicas) {
  std::map<int, Holdings> out;
  for (int r = 0; r < topo.world_size(); ++r) {
    Holdings h;
    auto it = have.find(r);
    if (it != have.end()) h = it->second;
    if (restart.count(r)) h.live.reset();
    if (moved.count(r) || gone_slots.count(v.slot_of(r))) h.own.clear();
    const int holder = backup_holder(topo, r, replicas).holder;
    if (holder < 0 || gone_slots.count(v.slot_of(holder))) h.backup.clear();
    out[r] = std::move(h);
  }
  return out;
}

std::map<int, std::pair<int, int>> where(const Topology& topo, const ClusterView& v,
                                         bool replicas) {
  std::map<int, std::pair<int, int>> w;
  for (int r = 0; r < topo.world_size(); ++r) {
    const int holder = backup_holder(topo, r, replicas).holder;
    w[r] = {v.slot_of(r), holder >= 0 ? v.slot_of(holder) : -1};
  }
  return w;
}

void fill_restore(Plan* p, const std::map<int, Holdings>& h, const Topology& topo,
                  const ClusterView& v, const Options& o) {
  p->restore = restore_point(h, topo.world_size(), o.persistent_step,
                             o.recovery.allow_restart_from_scratch(),
                             where(topo, v, replicas_hold_backups(topo, o.zero1)));
  if (!p->restore.ok) {
    p->kind = Plan::Kind::kStop;
    p->why = p->restore.why;
  }
}

// recovery.on_no_standby = shrink_dp: the DP replica that lost ranks is dropped; the
// survivors keep their state (replicas are equal without ZeRO-1) under new ids, each replica
// running more micro-batches so that every step trains on the same samples.
Plan shrink(const std::set<int>& out_ranks, const ClusterView& v,
            const std::map<int, Holdings>& have, const Options& o,
            const std::set<int>& gone_slots) {
  const Topology& topo = v.topo;
  std::set<int> replicas;
  for (int r : out_ranks) replicas.insert(topo.coord(r).dp);
  std::string why;
  if (replicas.size() != 1) why = "the lost ranks span several data-parallel replicas";
  if (topo.dp() <= 1) why = "there is a single data-parallel replica left";
  if (why.empty() && o.global_batch % (o.micro_batch * (topo.dp() - 1)) != 0)
    why = detail::concat("train.global_batch_size ", o.global_batch,
                         " does not split into micro-batches of ", o.micro_batch, " over ",
                         topo.dp() - 1, " replicas");
  if (!why.empty()) return stop("no standby is ready and data parallelism cannot shrink: " + why);
  Plan p;
  p.rung = PlanRung::kShrink;
  const int d = *replicas.begin();
  const Topology next(topo.tp(), topo.pp(), topo.dp() - 1);
  std::set<int> retired_slots;
  for (int r = 0; r < topo.world_size(); ++r) {
    Coord c = topo.coord(r);
    if (c.dp == d) {
      if (!out_ranks.count(r)) p.kill.insert(r);
      if (v.slot_of(r) >= 0 && !gone_slots.count(v.slot_of(r))) retired_slots.insert(v.slot_of(r));
      continue;
    }
    if (c.dp > d) --c.dp;
    p.renumber[r] = next.rank(c);
  }
  p.retire_slots.assign(retired_slots.begin(), retired_slots.end());
  p.next_topo = next;
  // The step is chosen among the survivors, under their old ids.
  std::map<int, Holdings> h =
      usable(have, topo, v, {}, {}, gone_slots, replicas_hold_backups(topo, o.zero1));
  std::map<int, Holdings> kept;
  for (const auto& [old_id, new_id] : p.renumber) kept[new_id] = h[old_id];
  p.restore = restore_point(kept, next.world_size(), -1, false);
  if (!p.restore.ok)
    return stop("data parallelism cannot shrink: the surviving replicas hold no common step");
  p.why = detail::concat("no standby is ready; recovery.on_no_standby = shrink_dp");
  p.action = detail::concat("shrink data parallelism to ", next.dp(), " (replica ", d, " dropped)");
  return p;
}

}  // namespace

std::vector<int> ClusterView::ranks_on(int slot) const {
  std::vector<int> out;
  for (size_t r = 0; r < rank_slot.size(); ++r)
    if (rank_slot[r] == slot) out.push_back(int(r));
  return out;
}

const char* failure_kind_name(FailureKind k) {
  switch (k) {
    case FailureKind::kCrash:
      return "crash";
    case FailureKind::kExit:
      return "exit";
    case FailureKind::kHang:
      return "hang";
    case FailureKind::kSlotLoss:
      return "slot_loss";
    case FailureKind::kPartition:
      return "partition";
    case FailureKind::kCommError:
      return "comm_error";
    case FailureKind::kSdc:
      return "sdc";
    case FailureKind::kSlow:
      return "slow";
  }
  return "?";
}

SlowAction decide_slow(int culprit, const ClusterView& v, const Options& o) {
  SlowAction a;
  if (o.detect.on_slow() == config::DetectConfig::warn) {
    a.why = "detect.on_slow = warn";
  } else if (o.recovery.mode() != config::RecoveryConfig::hot_swap || !v.has_slots()) {
    a.why = "no slot to swap (recovery.mode is not hot_swap, or the job runs without slots)";
  } else if (v.slot_of(culprit) < 0 || v.slot_of(culprit) == v.controller_slot) {
    a.why = detail::concat("its slot ", v.slot_of(culprit),
                           " hosts the controller in its agent's process and is never evicted");
  } else if (v.ready_standbys.empty()) {
    a.why = "no standby is ready";
  } else {
    a.evict = true;
    a.why = detail::concat("a slow slot costs every step of the job: standby slot ",
                           *v.ready_standbys.begin(), " is ready to take its ranks");
  }
  return a;
}

RestorePoint restore_point(const std::map<int, Holdings>& have, int world, int64_t persistent_step,
                           bool allow_scratch, const std::map<int, std::pair<int, int>>& where) {
  RestorePoint rp;
  std::set<int64_t> common;
  std::set<int> empty;
  for (int r = 0; r < world; ++r) {
    std::set<int64_t> mine;
    auto it = have.find(r);
    if (it != have.end()) {
      const Holdings& h = it->second;
      if (h.live) mine.insert(*h.live);
      mine.insert(h.own.begin(), h.own.end());
      mine.insert(h.backup.begin(), h.backup.end());
    }
    if (mine.empty()) empty.insert(r);
    if (r == 0) {
      common = mine;
      continue;
    }
    std::set<int64_t> both;
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                          std::inserter(both, both.begin()));
    common.swap(both);
  }
  if (!common.empty() && *common.rbegin() >= persistent_step) {
    rp.step = *common.rbegin();
    for (int r = 0; r < world; ++r) {
      const Holdings& h = have.at(r);
      rp.sources[r] = h.live && *h.live == rp.step ? membership::memory
                      : h.own.count(rp.step)       ? membership::own_snapshot
                                                   : membership::backup;
    }
    return rp;
  }
  // Why memory does not suffice, naming the ranks and where their copies were.
  std::string why;
  if (!common.empty()) {
    why = detail::concat("the persistent checkpoint of step ", persistent_step,
                         " is newer than any step every rank holds in memory (", *common.rbegin(),
                         ")");
  } else if (!empty.empty()) {
    why = detail::concat("no copy of the state of ", plural("rank", empty.size()), join(empty),
                         " survives");
    std::string places;
    for (int r : empty) {
      auto w = where.find(r);
      if (w == where.end()) continue;
      places += detail::concat(places.empty() ? "" : "; ", "rank ", r, ": own snapshot on slot ",
                               w->second.first, ", backup on slot ", w->second.second);
    }
    if (!places.empty()) why += " (" + places + ", both lost)";
  } else {
    why = "the ranks hold no step in common";
  }
  if (persistent_step >= 0) {
    rp.step = persistent_step;
    rp.job_source = membership::persistent;
    for (int r = 0; r < world; ++r) rp.sources[r] = membership::persistent;
    rp.why = why;
    return rp;
  }
  if (allow_scratch) {
    rp.step = -1;
    rp.job_source = membership::scratch;
    for (int r = 0; r < world; ++r) rp.sources[r] = membership::scratch;
    rp.why = why +
             "; no persistent checkpoint: starting over from step 0 "
             "(recovery.allow_restart_from_scratch)";
    return rp;
  }
  rp.ok = false;
  rp.why = why +
           "; there is no persistent checkpoint (checkpoint.persistent_every_steps) and "
           "recovery.allow_restart_from_scratch is false";
  return rp;
}

int64_t abort_deadline_ms(const config::RecoveryConfig& rc, double median_step_s) {
  const double by_steps = rc.abort_timeout_steps() * median_step_s * 1000.0;
  return std::max<int64_t>(rc.abort_timeout_ms(), int64_t(std::ceil(by_steps)));
}

// Holdings and options without any step after `at_most` (an SDC rollback: later states may
// be corrupt).
std::map<int, Holdings> no_later_than(std::map<int, Holdings> have, int64_t at_most) {
  for (auto& [r, h] : have) {
    if (h.live && *h.live > at_most) h.live.reset();
    std::erase_if(h.own, [&](int64_t s) { return s > at_most; });
    std::erase_if(h.backup, [&](int64_t s) { return s > at_most; });
  }
  return have;
}

Plan decide(const Failure& f, const ClusterView& v, const std::map<int, Holdings>& have_all,
            const Options& o_all) {
  if (f.restore_at_most) {
    Options capped = o_all;
    if (capped.persistent_step > *f.restore_at_most) capped.persistent_step = -1;
    Failure g = f;
    g.restore_at_most.reset();
    Plan p = decide(g, v, no_later_than(have_all, *f.restore_at_most), capped);
    if (p.kind == Plan::Kind::kRecover && p.restore.job_source == membership::memory)
      p.action += detail::concat("; roll back to verified step ", p.restore.step);
    return p;
  }
  const std::map<int, Holdings>& have = have_all;
  const Options& o = o_all;
  const Topology& topo = v.topo;
  const auto mode = o.recovery.mode();
  // Slots silent now, whether or not the failure was first seen as their loss.
  std::set<int> lost_slots = f.lost_slots;
  for (int r : f.dead)
    if (v.has_slots() && lost(v, v.slot_of(r))) lost_slots.insert(v.slot_of(r));

  if (mode == config::RecoveryConfig::restart_all) {
    Plan p;
    p.rung = PlanRung::kRestartAll;
    p.restart_all = true;
    for (int r = 0; r < topo.world_size(); ++r) p.restart.insert(r);
    // Every rank starts again; a lost slot's ranks start on a standby.
    std::set<int> free = v.ready_standbys;
    for (int s : lost_slots) {
      if (free.empty()) {
        if (!v.pending_standbys.empty() && !v.standby_wait_over)
          return wait_for_standby(detail::concat("slot ", s, " is lost; standby slot ",
                                                 *v.pending_standbys.begin(),
                                                 " is checking itself"));
        if (o.recovery.on_no_standby() == config::RecoveryConfig::wait)
          return v.standby_wait_over
                     ? stop(no_standby_within(s, o))
                     : wait_for_standby(detail::concat("slot ", s,
                                                       " is lost and no standby is ready; waiting "
                                                       "(recovery.on_no_standby = wait)"));
        return stop(detail::concat("slot ", s,
                                   " is lost and no standby is ready to take its "
                                   "ranks (recovery.mode = restart_all)"));
      }
      p.evict.push_back(s);
      p.promote[s] = *free.begin();
      free.erase(free.begin());
    }
    p.restore = restore_point({}, topo.world_size(), o.persistent_step,
                              o.recovery.allow_restart_from_scratch());
    if (!p.restore.ok)
      return stop(
          "recovery.mode = restart_all restarts every rank from the newest persistent "
          "checkpoint, and " +
          p.restore.why);
    p.why = "recovery.mode = restart_all";
    p.action =
        p.restore.step >= 0
            ? detail::concat("restart all ranks from the checkpoint of step ", p.restore.step)
            : std::string("restart all ranks from the start");
    if (!p.promote.empty()) {
      std::string sw;
      for (const auto& [s, sb] : p.promote)
        sw += detail::concat(sw.empty() ? "" : ", ", "slot ", s, " -> standby slot ", sb);
      p.action += " (" + sw + ")";
    }
    return p;
  }

  // Which slots leave the job.
  std::set<int> evict;
  const bool swap = mode == config::RecoveryConfig::hot_swap && v.has_slots();
  if (swap) {
    // A lost slot whose machine came back while the recovery waited (repaired, joined again
    // with --join) holds its ranks again: they start there anew, as in_place would, and the
    // waiting ends; only slots still lost are evicted.
    for (int s : lost_slots)
      if (lost(v, s)) evict.insert(s);
    // A hung machine is not trusted again until it has checked itself; the controller's own
    // slot (mpirun's slot 0) is never evicted.
    if ((f.kind == FailureKind::kHang || f.kind == FailureKind::kSdc ||
         f.kind == FailureKind::kSlow) &&
        f.culprit >= 0 && v.slot_of(f.culprit) != v.controller_slot)
      evict.insert(v.slot_of(f.culprit));
    // Slots that failed the stop-time diagnostics (the controller's own cannot go).
    for (int s : f.failed_slots)
      if (s != v.controller_slot) evict.insert(s);
    const auto scope = o.recovery.evict();
    int widen = f.culprit;
    if (widen < 0 && !lost_slots.empty() && !v.ranks_on(*lost_slots.begin()).empty())
      widen = v.ranks_on(*lost_slots.begin()).front();
    if (scope != config::RecoveryConfig::culprit && widen >= 0 && !evict.empty()) {
      std::vector<int> group;
      if (scope == config::RecoveryConfig::pp_group) {
        group = topo.pp_group(widen);
      } else {
        for (int q = 0; q < topo.world_size(); ++q)
          if (topo.coord(q).dp == topo.coord(widen).dp) group.push_back(q);
      }
      for (int q : group)
        if (v.slot_of(q) != v.controller_slot) evict.insert(v.slot_of(q));
    }
  } else if (!lost_slots.empty()) {
    // in_place (or hot_swap without slots to swap): a lost slot's ranks can only come back
    // on the same slot.
    if (o.detect.on_slot_loss() == config::DetectConfig::fail) {
      const RestorePoint rp = restore_point(
          usable(have, topo, v, f.dead, {}, lost_slots, replicas_hold_backups(topo, o.zero1)),
          topo.world_size(), o.persistent_step, false);
      return stop(
          detail::concat("slot ", join(lost_slots),
                         " lost; detect.on_slot_loss = fail. The newest step every "
                         "rank can restore is ",
                         rp.ok ? std::to_string(rp.step) : std::string("none (the job's start)")));
    }
    for (int s : lost_slots)
      if (lost(v, s))
        return wait(detail::concat("slot ", join(lost_slots),
                                   " lost; waiting for it to rejoin (detect.on_slot_loss = wait)"));
  }

  Plan p;
  std::set<int> restart = f.dead;
  std::set<int> moved;
  // A rank that computes wrong is not kept running where no slot can be evicted for it: a new
  // process takes its rank (a transient fault goes away with the old one).
  if (f.kind == FailureKind::kSdc && f.culprit >= 0 && evict.empty()) {
    restart.insert(f.culprit);
    p.kill.insert(f.culprit);
  }
  for (int s : evict)
    for (int r : v.ranks_on(s)) {
      moved.insert(r);
      restart.insert(r);
      if (!f.dead.count(r)) p.kill.insert(r);
    }

  // A standby for each evicted slot.
  std::set<int> free = v.ready_standbys;
  for (int s : evict) {
    if (!free.empty()) {
      p.evict.push_back(s);
      p.promote[s] = *free.begin();
      free.erase(free.begin());
      continue;
    }
    if (!v.pending_standbys.empty() && !v.standby_wait_over)
      return wait_for_standby(detail::concat("slot ", s, " is out; standby slot ",
                                             *v.pending_standbys.begin(),
                                             " is still checking itself"));
    switch (o.recovery.on_no_standby()) {
      case config::RecoveryConfig::shrink_dp: {
        Plan sp = shrink(restart, v, have, o, evict);
        if (sp.kind == Plan::Kind::kRecover) {
          sp.evict.assign(evict.begin(), evict.end());
          sp.kill.insert(p.kill.begin(), p.kill.end());
        }
        return sp;
      }
      case config::RecoveryConfig::reshape: {
        // Dropping a replica keeps every survivor's state as it is: that first, where it can.
        if (!o.zero1) {
          Plan sp = shrink(restart, v, have, o, evict);
          if (sp.kind == Plan::Kind::kRecover) {
            sp.evict.assign(evict.begin(), evict.end());
            sp.kill.insert(p.kill.begin(), p.kill.end());
            return sp;
          }
        }
        std::set<int> gone(evict.begin(), evict.end());
        gone.insert(lost_slots.begin(), lost_slots.end());
        Plan rp = plan_reshape(
            restart, v,
            usable(have, topo, v, restart, moved, gone, replicas_hold_backups(topo, o.zero1)), o,
            gone);
        if (rp.kind == Plan::Kind::kRecover) {
          rp.evict.assign(evict.begin(), evict.end());
          rp.kill.insert(p.kill.begin(), p.kill.end());
        }
        return rp;
      }
      case config::RecoveryConfig::wait:
        if (v.standby_wait_over) return stop(no_standby_within(s, o));
        return wait_for_standby(detail::concat("slot ", s,
                                               " is out and no standby is ready; waiting "
                                               "(recovery.on_no_standby = wait)"));
      default:
        return stop(detail::concat("slot ", s,
                                   " is out and no standby is ready; "
                                   "recovery.on_no_standby = fail"));
    }
  }

  p.restart = restart;
  std::set<int> gone_slots(evict.begin(), evict.end());
  gone_slots.insert(lost_slots.begin(), lost_slots.end());
  fill_restore(
      &p, usable(have, topo, v, restart, moved, gone_slots, replicas_hold_backups(topo, o.zero1)),
      topo, v, o);
  if (p.kind == Plan::Kind::kStop) return p;

  // Rung 3: the newest persistent checkpoint, whatever memory holds.
  if (f.from_checkpoint && o.persistent_step >= 0) {
    p.restore = restore_point({}, topo.world_size(), o.persistent_step, false);
    p.restore.why = f.ladder_why;
  }

  const std::string who = join(restart);
  if (!p.promote.empty()) {
    p.rung = PlanRung::kEvict;
    p.why = f.kind == FailureKind::kHang ? "a hung slot is not trusted until it checked itself"
            : f.kind == FailureKind::kSdc
                ? "a slot that computes wrong silently is not trusted until it checked itself"
            : f.kind == FailureKind::kSlow
                ? "a slow slot costs every step of the job: a warm standby takes its ranks"
            : !f.failed_slots.empty()
                ? "no culprit; the slot failed the stop-time diagnostics or the replay"
                : "the slot is out; a warm standby takes its ranks";
    std::set<int> ev(p.evict.begin(), p.evict.end()), sb;
    for (const auto& [s, k] : p.promote) sb.insert(k);
    p.action = "evict slot " + join(ev) + "; standby slot " + join(sb) + " takes " +
               (restart.size() > 1 ? "ranks " : "rank ") + who;
  } else if (!restart.empty()) {
    p.rung = PlanRung::kRestart;
    p.why = "a clear culprit on a live slot: restart it, the others rebuild";
    p.action =
        "restart " + std::string(restart.size() > 1 ? "ranks " : "rank ") + who + " in place";
  } else if (f.kind == FailureKind::kSdc && !f.replay_cleared) {
    p.rung = PlanRung::kRollback;
    p.why = "corruption with no clear culprit: every rank goes back to verified state";
    p.action = "roll back in place (no clear culprit)";
  } else if (f.from_checkpoint && o.persistent_step >= 0) {
    p.rung = PlanRung::kRollback;
    p.why = f.ladder_why;
    p.action = "roll back in place";
  } else {
    p.rung = PlanRung::kReattempt;
    p.why = f.replay_cleared ? "the replay found no machine that computes wrong: every rank "
                               "rebuilds its communicators and goes on from its newest step"
            : f.diagnosed    ? "no culprit, and the stop-time diagnostics passed: every rank "
                               "rebuilds its communicators and goes on"
                             : "no culprit: every rank rebuilds its communicators and goes on";
    p.action = "reattempt in place (no culprit)";
  }
  if (p.restore.job_source == membership::persistent)
    p.action += detail::concat("; restore the persistent checkpoint of step ", p.restore.step);
  if (p.restore.job_source == membership::scratch) p.action += "; start over from step 0";
  return p;
}

const char* plan_rung_name(PlanRung r) {
  switch (r) {
    case PlanRung::kRestart:
      return "restart";
    case PlanRung::kEvict:
      return "evict";
    case PlanRung::kReattempt:
      return "reattempt";
    case PlanRung::kRollback:
      return "rollback";
    case PlanRung::kRestartAll:
      return "restart_all";
    case PlanRung::kShrink:
      return "shrink";
    case PlanRung::kGrow:
      return "grow";
    case PlanRung::kReshape:
      return "reshape";
  }
  return "reattempt";
}

bool can_grow(const ClusterView& v, const Options& o) {
  const Topology& topo = v.topo;
  if (o.recovery.on_no_standby() == config::RecoveryConfig::reshape)
    return reshape_growth(v, o).has_value();
  return o.recovery.on_no_standby() == config::RecoveryConfig::shrink_dp &&
         topo.dp() < v.configured_dp && v.has_slots() &&
         int(v.ready_standbys.size()) * v.workers_per_slot >= topo.tp() * topo.pp();
}

std::optional<Plan> decide_grow(const ClusterView& v, const std::map<int, Holdings>& have,
                                const Options& o) {
  const Topology& topo = v.topo;
  if (o.recovery.on_no_standby() == config::RecoveryConfig::reshape)
    return plan_reshape_grow(v, have, o);
  if (!can_grow(v, o)) return std::nullopt;
  Plan p;
  p.rung = PlanRung::kGrow;
  const Topology next(topo.tp(), topo.pp(), topo.dp() + 1);
  for (int r = 0; r < topo.world_size(); ++r) p.renumber[r] = next.rank(topo.coord(r));
  for (int r = 0; r < next.world_size(); ++r)
    if (next.coord(r).dp == topo.dp()) p.new_ranks.push_back(r);
  p.restart.insert(p.new_ranks.begin(), p.new_ranks.end());
  p.next_topo = next;
  // The new replica receives the state from its DP group: the step is the survivors'.
  p.restore = restore_point(have, topo.world_size(), -1, false);
  if (!p.restore.ok) return std::nullopt;
  std::map<int, membership::Source> src;
  for (const auto& [old_id, new_id] : p.renumber) src[new_id] = p.restore.sources[old_id];
  for (int r : p.new_ranks) src[r] = membership::replica;
  p.restore.sources = src;
  p.why = detail::concat("standby slots for a whole replica are ready; data parallelism was ",
                         topo.dp(), " of ", v.configured_dp);
  p.action = detail::concat("grow data parallelism back to ", next.dp(), " replicas");
  return p;
}

}  // namespace keel::policy
