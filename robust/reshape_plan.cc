#include "robust/reshape_plan.h"

#include <string>
#include <vector>

#include "ckpt/backup_placement.h"
#include "robust/reshape_layout.h"
#include "runtime/check.h"

namespace keel::policy {
namespace {

Plan stop(std::string why) {
  Plan p;
  p.kind = Plan::Kind::kStop;
  p.why = std::move(why);
  return p;
}

// Every new rank reads the old ranks' copies of one step: a survivor's live state counts
// through its own snapshot (it finishes writing it before it serves), a rank that is gone or
// stopped takes its copies with it, and every backup it held.
std::map<int, Holdings> readable_copies(const std::map<int, Holdings>& have, const Topology& topo,
                                        bool zero1, const std::set<int>& gone) {
  const bool replicas = replicas_hold_backups(topo, zero1);
  std::map<int, Holdings> h;
  for (int r = 0; r < topo.world_size(); ++r) {
    auto it = have.find(r);
    Holdings x = it == have.end() ? Holdings{} : it->second;
    if (x.live && !gone.count(r)) x.own.insert(*x.live);
    x.live.reset();
    if (gone.count(r)) x.own.clear();
    const int holder = backup_holder(topo, r, replicas).holder;
    if (holder < 0 || gone.count(holder)) x.backup.clear();
    h[r] = x;
  }
  return h;
}

}  // namespace

Plan plan_reshape(const std::set<int>& out, const ClusterView& v,
                  const std::map<int, Holdings>& have, const Options& o,
                  const std::set<int>& gone_slots) {
  const Topology& topo = v.topo;
  if (!v.has_slots()) return stop("no standby is ready and a job without slots cannot reshape");
  // The slots that still hold running ranks, by id.
  std::set<int> live;
  for (int r = 0; r < topo.world_size(); ++r)
    if (!out.count(r) && !gone_slots.count(v.slot_of(r))) live.insert(v.slot_of(r));
  ReshapeRequest rq;
  rq.configured = o.configured.value_or(topo);
  rq.live_slots = int(live.size());
  rq.workers_per_slot = v.workers_per_slot;
  rq.micro_batch = o.micro_batch;
  rq.global_batch = o.global_batch;
  rq.invalid = o.layout_invalid;
  std::string why_not;
  const std::optional<ReshapeChoice> choice = choose_reshape(rq, &why_not);
  if (!choice) return stop("no standby is ready and the job cannot reshape: " + why_not);

  Plan p;
  p.rung = PlanRung::kReshape;
  p.next_topo = choice->topo;
  int index = 0;
  for (int s : live) {
    const std::vector<int> ranks = v.ranks_on(s);  // ascending: their places on the slot
    if (index < choice->slots) {
      for (size_t j = 0; j < ranks.size(); ++j) {
        const int id = index * v.workers_per_slot + int(j);
        p.renumber[ranks[j]] = id;
        // A worker of a kept slot that died in the same failure: a new process takes its
        // place and reads its state like every other rank.
        if (out.count(ranks[j])) p.restart.insert(id);
      }
    } else {
      for (int r : ranks) p.kill.insert(r);
      p.retire_slots.push_back(s);
    }
    ++index;
  }
  KEEL_CHECK(int(p.renumber.size()) == choice->topo.world_size(), "reshape: ", p.renumber.size(),
             " survivors for ", choice->topo.world_size(), " ranks");

  std::set<int> gone = out;
  gone.insert(p.kill.begin(), p.kill.end());
  const std::map<int, Holdings> h = readable_copies(have, topo, o.zero1, gone);
  p.restore = restore_point(h, topo.world_size(), o.persistent_step, false);
  if (!p.restore.ok)
    return stop("no standby is ready and the job cannot reshape: " + p.restore.why);
  // The incident's sources are the new ranks'.
  p.restore.sources.clear();
  for (const auto& [old_id, new_id] : p.renumber) p.restore.sources[new_id] = p.restore.job_source;
  p.why =
      "no standby is ready and data parallelism cannot shrink; recovery.on_no_standby = reshape";
  p.action = detail::concat("reshape from ", layout_label(topo), " to ", choice->why);
  if (!p.retire_slots.empty()) {
    std::string slots;
    for (int s : p.retire_slots) slots += (slots.empty() ? "" : ", ") + std::to_string(s);
    p.action += "; slot(s) " + slots + " wait as standbys";
  }
  return p;
}

}  // namespace keel::policy

namespace keel::policy {

std::optional<ReshapeChoice> reshape_growth(const ClusterView& v, const Options& o) {
  const Topology& topo = v.topo;
  const Topology configured = o.configured.value_or(topo);
  if (o.recovery.on_no_standby() != config::RecoveryConfig::reshape || !v.has_slots() ||
      v.ready_standbys.empty() || topo == configured)
    return std::nullopt;
  std::set<int> active(v.rank_slot.begin(), v.rank_slot.end());
  ReshapeRequest rq;
  rq.configured = configured;
  rq.live_slots = int(active.size() + v.ready_standbys.size());
  rq.workers_per_slot = v.workers_per_slot;
  rq.micro_batch = o.micro_batch;
  rq.global_batch = o.global_batch;
  rq.invalid = o.layout_invalid;
  std::optional<ReshapeChoice> c = choose_reshape(rq, nullptr);
  if (!c || c->topo == topo || c->topo.world_size() < topo.world_size()) return std::nullopt;
  return c;
}

std::optional<Plan> plan_reshape_grow(const ClusterView& v, const std::map<int, Holdings>& have,
                                      const Options& o) {
  const std::optional<ReshapeChoice> c = reshape_growth(v, o);
  if (!c) return std::nullopt;
  const Topology& topo = v.topo;
  Plan p;
  p.rung = PlanRung::kReshape;
  p.next_topo = c->topo;
  // The slots that hold ranks keep theirs, in order; the ready standbys take the rest.
  const std::set<int> active(v.rank_slot.begin(), v.rank_slot.end());
  int index = 0;
  for (int s : active) {
    const std::vector<int> ranks = v.ranks_on(s);
    for (size_t j = 0; j < ranks.size(); ++j)
      p.renumber[ranks[j]] = index * v.workers_per_slot + int(j);
    ++index;
  }
  for (int r = int(p.renumber.size()); r < c->topo.world_size(); ++r) p.new_ranks.push_back(r);
  p.restart.insert(p.new_ranks.begin(), p.new_ranks.end());
  // The survivors' copies only: the job has every rank, so a checkpoint is never needed.
  p.restore = restore_point(readable_copies(have, topo, o.zero1, {}), topo.world_size(), -1, false);
  if (!p.restore.ok) return std::nullopt;
  p.restore.sources.clear();
  for (int r = 0; r < c->topo.world_size(); ++r) p.restore.sources[r] = membership::memory;
  p.why = detail::concat(v.ready_standbys.size(), " standby slot(s) ready; the job runs ",
                         layout_label(topo), " of ", layout_label(o.configured.value_or(topo)));
  p.action = detail::concat("grow back from ", layout_label(topo), " to ", c->why);
  return p;
}

}  // namespace keel::policy
