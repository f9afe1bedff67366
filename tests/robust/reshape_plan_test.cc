// recovery.on_no_standby = reshape through decide(): which layout, which survivor becomes
// which rank, which slots retire, and which step the new ranks read from the old ranks'
// copies. Fake memberships, no processes.
#include "robust/reshape_plan.h"

#include <gtest/gtest.h>

#include "policy_fixtures.h"

#include "ckpt/backup_placement.h"

namespace keel::policy {
namespace {

using membership::SlotInfo;
using Kind = Plan::Kind;

// `topo` on slots of `wps` workers (ranks in order), no standby.
ClusterView view_of(const Topology& topo, int wps) {
  ClusterView v;
  v.topo = topo;
  v.configured_dp = topo.dp();
  v.workers_per_slot = wps;
  for (int r = 0; r < topo.world_size(); ++r) v.rank_slot.push_back(r / wps);
  for (int s = 0; s < topo.world_size() / wps; ++s) v.slots[s] = SlotInfo::active;
  return v;
}

// Slot `slot` lost: its link lost in `v`, as the membership shows it, and its ranks dead.
Failure lose_slot(ClusterView& v, int slot) {
  v.slots[slot] = SlotInfo::lost;
  Failure f;
  f.kind = FailureKind::kSlotLoss;
  f.lost_slots = {slot};
  for (int r : v.ranks_on(slot)) f.dead.insert(r);
  f.culprit = *f.dead.begin();
  return f;
}

Options reshape_opts(int global_batch, bool zero1 = false) {
  Options o;
  o.recovery.set_mode(config::RecoveryConfig::hot_swap);
  o.recovery.set_on_no_standby(config::RecoveryConfig::reshape);
  o.micro_batch = 1;
  o.global_batch = global_batch;
  o.zero1 = zero1;
  // A model of 2 layers and 4 heads: TP 3 does not divide it, PP 3 has no layer to spare.
  o.layout_invalid = [](const Topology& t) -> std::string {
    if (4 % t.tp() != 0) return "num_heads 4 is not divisible by tp";
    if (t.pp() > 2) return "2 layers cannot make more stages";
    return "";
  };
  return o;
}

TEST(ReshapePlan, TwoSlotsLoseOneAndTheSurvivorsTakeTheLargestLayout) {
  // The acceptance job: TP2xPP2xDP1 on 2 slots of 2 workers, slot 1 lost.
  ClusterView v = view_of(Topology(2, 2, 1), 2);
  const Failure f = lose_slot(v, 1);
  const Plan p = decide(f, v, holdings(4, 50, f.dead), reshape_opts(8));
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kReshape);
  EXPECT_STREQ(plan_rung_name(p.rung), "reshape");
  ASSERT_TRUE(p.next_topo);
  // 2 ranks; the most model parallelism that fits, TP nearest the configured 2.
  EXPECT_EQ(p.next_topo->tp(), 2);
  EXPECT_EQ(p.next_topo->pp(), 1);
  EXPECT_EQ(p.next_topo->dp(), 1);
  EXPECT_EQ(p.renumber, (std::map<int, int>{{0, 0}, {1, 1}}));
  EXPECT_TRUE(p.kill.empty());
  EXPECT_TRUE(p.retire_slots.empty());
  EXPECT_EQ(p.evict, std::vector<int>{1});
  // Ranks 2 and 3 are read from their backups on slot 0: the newest step, from memory.
  EXPECT_EQ(p.restore.step, 50);
  EXPECT_EQ(p.restore.job_source, membership::memory);
  EXPECT_EQ(p.restore.sources.size(), 2u);
  EXPECT_NE(p.action.find("reshape from TP2xPP2xDP1 to TP2xPP1xDP1 on 1 of 1 slot(s)"),
            std::string::npos)
      << p.action;
}

TEST(ReshapePlan, AWorkerOfAKeptSlotThatDiedTooIsStartedAgain) {
  // Slot 1 lost and, in the same failure, rank 1 on slot 0 crashed.
  ClusterView v = view_of(Topology(2, 2, 1), 2);
  Failure f = lose_slot(v, 1);
  f.dead.insert(1);
  Options o = reshape_opts(8);
  o.persistent_step = 40;
  const Plan p = decide(f, v, holdings(4, 50, f.dead), o);
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kReshape);
  EXPECT_EQ(p.renumber, (std::map<int, int>{{0, 0}, {1, 1}}));
  EXPECT_EQ(p.restart, std::set<int>{1});
  // Rank 1's own copy went with its process and its backup with slot 1: the checkpoint.
  ASSERT_EQ(backup_holder(v.topo, 1, false).holder / 2, 1) << "placement changed";
  EXPECT_EQ(p.restore.job_source, membership::persistent);
  EXPECT_EQ(p.restore.step, 40);
}

TEST(ReshapePlan, ShrinkingDataParallelismComesFirstWhereItApplies) {
  ClusterView v = view_of(Topology(2, 2, 2), 2);
  const Failure f = lose_slot(v, 3);
  const Plan p = decide(f, v, holdings(8, 20, f.dead), reshape_opts(8));
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kShrink);
  EXPECT_EQ(p.next_topo->dp(), 1);
}

TEST(ReshapePlan, ZeroOneReshapesInsteadOfShrinking) {
  ClusterView v = view_of(Topology(2, 2, 2), 2);
  const Failure f = lose_slot(v, 3);
  const Plan p = decide(f, v, holdings(8, 20, f.dead), reshape_opts(8, /*zero1=*/true));
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kReshape);
  // 6 ranks on 3 slots: TP2xPP1xDP3 would split a batch of 8 unevenly; TP1xPP2xDP3 too. The
  // most ranks that keep the batch: 4, at the configured model parallelism.
  EXPECT_EQ(p.next_topo->world_size(), 4);
  EXPECT_EQ(p.next_topo->tp() * p.next_topo->pp(), 4);
  // The first two live slots hold it; the third retires and waits as a standby.
  EXPECT_EQ(p.retire_slots, std::vector<int>{2});
  EXPECT_EQ(p.kill, (std::set<int>{4, 5}));
  EXPECT_EQ(p.renumber, (std::map<int, int>{{0, 0}, {1, 1}, {2, 2}, {3, 3}}));
  EXPECT_EQ(p.restore.job_source, membership::memory);
}

TEST(ReshapePlan, ARetiredRanksCopiesGoWithIt) {
  // TP1xPP1xDP4, one worker a slot, ZeRO-1 (no replica holds another's shard) and a batch of
  // 2: at most DP 2, so slot 2 retires and its rank is stopped before the new ranks read.
  // Rank 2's backup lives with rank 3, which is lost: memory cannot give rank 2's shard, the
  // newest persistent checkpoint does; without one the job stops naming what was lost.
  ClusterView v = view_of(Topology(1, 1, 4), 1);
  const Failure f = lose_slot(v, 3);
  ASSERT_EQ(backup_holder(v.topo, 2, false).holder, 3) << "placement changed; adjust the test";
  Options o = reshape_opts(2, /*zero1=*/true);
  o.persistent_step = 20;
  const Plan p = decide(f, v, holdings(4, 30, f.dead), o);
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kReshape);
  EXPECT_EQ(p.next_topo->world_size(), 2);
  EXPECT_EQ(p.retire_slots, std::vector<int>{2});
  EXPECT_EQ(p.kill, std::set<int>{2});
  EXPECT_EQ(p.renumber, (std::map<int, int>{{0, 0}, {1, 1}}));
  EXPECT_EQ(p.restore.job_source, membership::persistent);
  EXPECT_EQ(p.restore.step, 20);
  o.persistent_step = -1;
  const Plan q = decide(f, v, holdings(4, 30, f.dead), o);
  ASSERT_EQ(q.kind, Kind::kStop);
  EXPECT_NE(q.why.find("cannot reshape"), std::string::npos) << q.why;
}

TEST(ReshapePlan, NoLayoutFitsAndTheStopSaysWhy) {
  ClusterView v = view_of(Topology(2, 2, 1), 2);
  const Failure f = lose_slot(v, 1);
  Options o = reshape_opts(8);
  o.layout_invalid = [](const Topology& t) -> std::string {
    return t.world_size() < 4 ? "the model needs 4 ranks" : "";
  };
  const Plan p = decide(f, v, holdings(4, 50, f.dead), o);
  ASSERT_EQ(p.kind, Kind::kStop);
  EXPECT_NE(p.why.find("cannot reshape: no layout of at most 2 rank(s)"), std::string::npos)
      << p.why;
  EXPECT_NE(p.why.find("the model needs 4 ranks"), std::string::npos) << p.why;
}

TEST(ReshapePlan, GrowsBackWhenAStandbyIsReady) {
  // After the reshape of the first test: TP2xPP1xDP1 on slot 0; slot 1 joined again.
  ClusterView v = view_of(Topology(2, 1, 1), 2);
  v.slots[1] = SlotInfo::standby;
  Options o = reshape_opts(8);
  o.configured = Topology(2, 2, 1);
  EXPECT_FALSE(can_grow(v, o));  // slot 1 still checks itself
  v.pending_standbys.insert(1);
  EXPECT_FALSE(can_grow(v, o));
  v.pending_standbys.clear();
  v.ready_standbys.insert(1);
  ASSERT_TRUE(can_grow(v, o));
  std::map<int, Holdings> have;
  have[0].live = 70;
  have[1].live = 70;
  const std::optional<Plan> p = decide_grow(v, have, o);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->rung, PlanRung::kReshape);
  EXPECT_TRUE(*p->next_topo == Topology(2, 2, 1));
  EXPECT_EQ(p->renumber, (std::map<int, int>{{0, 0}, {1, 1}}));
  EXPECT_EQ(p->new_ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(p->restart, (std::set<int>{2, 3}));
  EXPECT_EQ(p->restore.step, 70);
  EXPECT_EQ(p->restore.job_source, membership::memory);
  EXPECT_NE(p->action.find("grow back from TP2xPP1xDP1 to TP2xPP2xDP1"), std::string::npos)
      << p->action;
  // At the configured layout there is nothing to grow into.
  const ClusterView full = view_of(Topology(2, 2, 1), 2);
  EXPECT_FALSE(can_grow(full, o));
}

}  // namespace
}  // namespace keel::policy
