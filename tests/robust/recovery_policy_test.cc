// The recovery policy through every branch, with a fake membership: TP2×PP2×DP2 on slots of
// two workers (ranks 2k, 2k+1 on slot k; slot 0 hosts the controller), standbys after them.
#include "robust/recovery_policy.h"

#include <gtest/gtest.h>

#include "policy_fixtures.h"

namespace keel::policy {
namespace {

using membership::SlotInfo;
using Kind = Plan::Kind;

ClusterView view_3d(int standbys_ready, int standbys_pending = 0) {
  ClusterView v;
  v.topo = Topology(2, 2, 2);
  v.configured_dp = 2;
  v.workers_per_slot = 2;
  for (int r = 0; r < 8; ++r) v.rank_slot.push_back(r / 2);
  for (int s = 0; s < 4; ++s) v.slots[s] = SlotInfo::active;
  for (int k = 0; k < standbys_ready + standbys_pending; ++k) {
    v.slots[4 + k] = SlotInfo::standby;
    (k < standbys_ready ? v.ready_standbys : v.pending_standbys).insert(4 + k);
  }
  return v;
}

Options opts(config::RecoveryConfig::Mode mode = config::RecoveryConfig::hot_swap) {
  Options o;
  o.recovery.set_mode(mode);
  o.micro_batch = 1;
  o.global_batch = 4;
  return o;
}

Failure crash(int rank) {
  Failure f;
  f.kind = FailureKind::kCrash;
  f.culprit = rank;
  f.dead = {rank};
  return f;
}

Failure slot_loss(const ClusterView& v, std::set<int> slots) {
  Failure f;
  f.kind = FailureKind::kSlotLoss;
  f.lost_slots = slots;
  for (int s : slots)
    for (int r : v.ranks_on(s)) f.dead.insert(r);
  f.culprit = *f.dead.begin();
  return f;
}

TEST(RecoveryPolicy, CrashOnALiveSlotRestartsTheRankInPlace) {
  ClusterView v = view_3d(1);
  Plan p = decide(crash(3), v, holdings(8, 30, {3}), opts());
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kRestart);
  EXPECT_EQ(p.restart, std::set<int>{3});
  EXPECT_TRUE(p.evict.empty());
  EXPECT_EQ(p.restore.step, 30);
  EXPECT_EQ(p.restore.sources.at(3), membership::own_snapshot);
  EXPECT_EQ(p.restore.sources.at(0), membership::memory);
  EXPECT_EQ(p.action, "restart rank 3 in place");
}

TEST(RecoveryPolicy, ExitWithoutSlotsRestartsInPlace) {
  ClusterView v;
  v.topo = Topology(1, 1, 2);
  Failure f = crash(1);
  f.kind = FailureKind::kExit;
  Plan p = decide(f, v, holdings(2, 5, {1}), opts(config::RecoveryConfig::in_place));
  ASSERT_EQ(p.kind, Kind::kRecover);
  EXPECT_EQ(p.restart, std::set<int>{1});
  EXPECT_EQ(p.restore.step, 5);
}

TEST(RecoveryPolicy, SlotLossSwapsInAStandbyAndRestoresFromBackups) {
  ClusterView v = view_3d(2);
  v.slots[1] = SlotInfo::lost;
  Plan p = decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), opts());
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kEvict);
  EXPECT_EQ(p.evict, std::vector<int>{1});
  EXPECT_EQ(p.promote.at(1), 4);
  EXPECT_EQ(p.restart, (std::set<int>{2, 3}));
  EXPECT_TRUE(p.kill.empty());
  EXPECT_EQ(p.restore.step, 30);
  // Its own snapshot was on the lost slot: the backup holder's copy.
  EXPECT_EQ(p.restore.sources.at(2), membership::backup);
  EXPECT_EQ(p.restore.sources.at(3), membership::backup);
  EXPECT_EQ(p.action, "evict slot 1; standby slot 4 takes ranks 2, 3");
}

TEST(RecoveryPolicy, PartitionIsEvictedLikeALoss) {
  ClusterView v = view_3d(1);
  v.slots[2] = SlotInfo::lost;  // cut off: its link lost, as the membership shows it
  Failure f = slot_loss(v, {2});
  f.kind = FailureKind::kPartition;
  Plan p = decide(f, v, holdings(8, 10, {4, 5}), opts());
  ASSERT_EQ(p.kind, Kind::kRecover);
  EXPECT_EQ(p.promote.at(2), 4);
}

TEST(RecoveryPolicy, HungRankOnASlotEvictsTheSlotAndKillsItsOtherWorker) {
  ClusterView v = view_3d(1);
  Failure f;
  f.kind = FailureKind::kHang;
  f.culprit = 4;
  f.dead = {4};
  f.rule = "liveness";
  Plan p = decide(f, v, holdings(8, 12, {4}), opts());
  ASSERT_EQ(p.kind, Kind::kRecover);
  EXPECT_EQ(p.evict, std::vector<int>{2});
  EXPECT_EQ(p.kill, std::set<int>{5});
  EXPECT_EQ(p.restart, (std::set<int>{4, 5}));
  // Moved to another slot: no own snapshot, no memory.
  EXPECT_EQ(p.restore.sources.at(5), membership::backup);
}

TEST(RecoveryPolicy, HangOnTheControllersSlotIsRestartedInPlace) {
  ClusterView v = view_3d(1);
  Failure f;
  f.kind = FailureKind::kHang;
  f.culprit = 1;
  f.dead = {1};
  Plan p = decide(f, v, holdings(8, 12, {1}), opts());
  ASSERT_EQ(p.kind, Kind::kRecover);
  EXPECT_TRUE(p.evict.empty());
  EXPECT_EQ(p.restart, std::set<int>{1});
}

// Silent data corruption: the named rank's slot goes (it is alive and acknowledged the abort,
// so its ranks are stopped), and nobody restores a step after the verified one: not its
// live state, not a newer snapshot, not a newer persistent checkpoint.
TEST(RecoveryPolicy, SdcEvictsTheCulpritsSlotAndRollsBackToTheVerifiedStep) {
  ClusterView v = view_3d(1);
  Failure f;
  f.kind = FailureKind::kSdc;
  f.culprit = 5;
  f.restore_at_most = 20;
  std::map<int, Holdings> h = holdings(8, 30);
  for (auto& [r, x] : h) x.own.insert(20);  // the verified slot
  h[4].backup.insert(20);                   // ranks 4, 5 move: their replicas' verified slots
  h[5].backup.insert(20);
  Options o = opts();
  o.persistent_step = 25;  // newer than the verified step: may be corrupt too
  Plan p = decide(f, v, h, o);
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kEvict);
  EXPECT_EQ(p.evict, std::vector<int>{2});
  EXPECT_EQ(p.promote.at(2), 4);
  EXPECT_EQ(p.kill, (std::set<int>{4, 5}));
  EXPECT_EQ(p.restore.step, 20);
  EXPECT_EQ(p.restore.job_source, membership::memory);
  EXPECT_EQ(p.restore.sources.at(5), membership::backup);
  EXPECT_EQ(p.restore.sources.at(0), membership::own_snapshot);
  EXPECT_NE(p.action.find("roll back to verified step 20"), std::string::npos) << p.action;

  // No clear culprit: the same rollback, in place.
  f.culprit = -1;
  p = decide(f, v, h, o);
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kRollback);
  EXPECT_TRUE(p.evict.empty());
  EXPECT_TRUE(p.kill.empty());
  EXPECT_EQ(p.restore.step, 20);

  // Nothing verified survives in memory: an older persistent checkpoint, never a newer one.
  for (auto& [r, x] : h) x.own.erase(20), x.backup.erase(20);
  o.persistent_step = 15;
  f.culprit = 5;
  p = decide(f, v, h, o);
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.restore.step, 15);
  EXPECT_EQ(p.restore.job_source, membership::persistent);
}

// An operator's replay (keel-ctl replay) that found no machine: nothing is suspect, so the
// job goes on from its newest step, not from the verified one.
TEST(RecoveryPolicy, AReplayThatFoundNothingGoesOnWithoutRollback) {
  ClusterView v = view_3d(1);
  Failure f;
  f.kind = FailureKind::kSdc;
  f.replay_cleared = true;  // the controller also dropped restore_at_most
  Plan p = decide(f, v, holdings(8, 30), opts());
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kReattempt);
  EXPECT_TRUE(p.kill.empty());
  EXPECT_TRUE(p.evict.empty());
  EXPECT_EQ(p.restore.step, 30);
  EXPECT_EQ(p.restore.job_source, membership::memory);
  EXPECT_NE(p.why.find("the replay found no machine"), std::string::npos) << p.why;
}

// Without slots to evict, the culprit's rank is stopped and started again.
TEST(RecoveryPolicy, SdcWithoutSlotsRestartsTheCulprit) {
  ClusterView v;
  v.topo = Topology(1, 1, 2);
  v.configured_dp = 2;
  Failure f;
  f.kind = FailureKind::kSdc;
  f.culprit = 1;
  f.restore_at_most = 8;
  std::map<int, Holdings> h = holdings(2, 10);
  for (auto& [r, x] : h) x.own.insert(8);
  Plan p = decide(f, v, h, opts());
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.restart, std::set<int>{1});
  EXPECT_EQ(p.kill, std::set<int>{1});
  EXPECT_EQ(p.restore.step, 8);
}

TEST(RecoveryPolicy, PpGroupEvictionTakesEverySlotOfThePipeline) {
  ClusterView v = view_3d(2);
  v.slots[1] = SlotInfo::lost;
  Options o = opts();
  o.recovery.set_evict(config::RecoveryConfig::pp_group);
  Plan p = decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), o);
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  // Rank 2 = (d1, p0, t0); its pipeline is ranks 2 and 6: slots 1 and 3.
  EXPECT_EQ(p.evict, (std::vector<int>{1, 3}));
  EXPECT_EQ(p.kill, (std::set<int>{6, 7}));
  EXPECT_EQ(p.restart, (std::set<int>{2, 3, 6, 7}));
}

TEST(RecoveryPolicy, DpReplicaEvictionNeverTakesSlotZero) {
  ClusterView v = view_3d(2);
  v.slots[2] = SlotInfo::lost;
  Options o = opts();
  o.recovery.set_evict(config::RecoveryConfig::dp_replica);
  Plan p = decide(slot_loss(v, {2}), v, holdings(8, 30, {4, 5}), o);
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  // Replica d0 is ranks 0, 1 (slot 0) and 4, 5 (slot 2): slot 0 hosts the controller.
  EXPECT_EQ(p.evict, std::vector<int>{2});
}

TEST(RecoveryPolicy, NoStandbyFailStops) {
  ClusterView v = view_3d(0);
  v.slots[1] = SlotInfo::lost;
  Plan p = decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), opts());
  EXPECT_EQ(p.kind, Kind::kStop);
  EXPECT_NE(p.why.find("no standby is ready"), std::string::npos) << p.why;
}

TEST(RecoveryPolicy, NoStandbyWaitWaits) {
  ClusterView v = view_3d(0);
  v.slots[1] = SlotInfo::lost;
  Options o = opts();
  o.recovery.set_on_no_standby(config::RecoveryConfig::wait);
  EXPECT_EQ(decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), o).kind, Kind::kWait);
}

// Every wait for a standby is bounded: once the controller has waited
// recovery.standby_wait_ms (standby_wait_over, pending standbys left out), on_no_standby =
// wait stops with the bound in its reason, and a standby still checking itself gives way to
// the configured fallback (shrink_dp here).
TEST(RecoveryPolicy, AWaitForAStandbyEndsWithTheBoundAndTheNextChoice) {
  ClusterView v = view_3d(0);
  v.slots[1] = SlotInfo::lost;
  Options o = opts();
  o.recovery.set_on_no_standby(config::RecoveryConfig::wait);
  o.recovery.set_standby_wait_ms(15000);
  v.standby_wait_over = true;
  Plan p = decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), o);
  EXPECT_EQ(p.kind, Kind::kStop);
  EXPECT_NE(p.why.find("no standby was ready within recovery.standby_wait_ms = 15000 ms"),
            std::string::npos)
      << p.why;
  o.recovery.set_mode(config::RecoveryConfig::restart_all);
  p = decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), o);
  EXPECT_EQ(p.kind, Kind::kStop);
  EXPECT_NE(p.why.find("recovery.standby_wait_ms = 15000 ms"), std::string::npos) << p.why;

  ClusterView checking = view_3d(0, 1);  // one standby, still checking itself
  checking.slots[1] = SlotInfo::lost;
  Options shrink = opts();
  shrink.recovery.set_on_no_standby(config::RecoveryConfig::shrink_dp);
  ASSERT_EQ(decide(slot_loss(checking, {1}), checking, holdings(8, 30, {2, 3}), shrink).kind,
            Kind::kWait);
  checking.pending_standbys.clear();  // what the controller does past the bound
  checking.standby_wait_over = true;
  p = decide(slot_loss(checking, {1}), checking, holdings(8, 30, {2, 3}), shrink);
  EXPECT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kShrink) << p.why;
}

// Waiting for a standby (on_no_standby = wait), the lost slot's own machine comes back (joined
// again, no workers): its ranks start there anew and the wait ends. It waited for ever before
// (the 100-fault soak with in-job etcd: a leader killed as slot 0 was lost).
TEST(RecoveryPolicy, ALostSlotThatCameBackWhileWaitingTakesItsRanksAgain) {
  ClusterView v = view_3d(0);
  v.slots[1] = SlotInfo::lost;
  Options o = opts();
  o.recovery.set_on_no_standby(config::RecoveryConfig::wait);
  const Failure f = slot_loss(v, {1});
  ASSERT_EQ(decide(f, v, holdings(8, 30, {2, 3}), o).kind, Kind::kWait);
  v.slots[1] = SlotInfo::active;  // it came back
  Plan back = decide(f, v, holdings(8, 30, {2, 3}), o);
  ASSERT_EQ(back.kind, Kind::kRecover) << back.why;
  EXPECT_EQ(back.restart, (std::set<int>{2, 3}));
  EXPECT_TRUE(back.evict.empty());
  EXPECT_TRUE(back.promote.empty());
}

TEST(RecoveryPolicy, AStandbyStillCheckingItselfIsWaitedFor) {
  ClusterView v = view_3d(0, 1);
  v.slots[1] = SlotInfo::lost;
  Plan p = decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), opts());
  EXPECT_EQ(p.kind, Kind::kWait);
  EXPECT_NE(p.why.find("checking itself"), std::string::npos);
}

TEST(RecoveryPolicy, NoStandbyShrinksDataParallelism) {
  ClusterView v = view_3d(0);
  v.slots[1] = SlotInfo::lost;
  Options o = opts();
  o.recovery.set_on_no_standby(config::RecoveryConfig::shrink_dp);
  Plan p = decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), o);
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kShrink);
  ASSERT_TRUE(p.next_topo);
  EXPECT_EQ(p.next_topo->dp(), 1);
  // Replica d1 (ranks 2, 3, 6, 7) is dropped; 6, 7 are alive and stopped; slot 3 retires.
  EXPECT_EQ(p.kill, (std::set<int>{6, 7}));
  EXPECT_EQ(p.retire_slots, std::vector<int>{3});
  EXPECT_EQ(p.renumber, (std::map<int, int>{{0, 0}, {1, 1}, {4, 2}, {5, 3}}));
  EXPECT_EQ(p.restore.step, 30);
  EXPECT_TRUE(p.restart.empty());
}

TEST(RecoveryPolicy, ShrinkRefusedWhenTheBatchDoesNotSplit) {
  ClusterView v = view_3d(0);
  v.slots[1] = SlotInfo::lost;
  Options o = opts();
  o.recovery.set_on_no_standby(config::RecoveryConfig::shrink_dp);
  o.global_batch = 3;
  o.micro_batch = 2;
  Plan p = decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), o);
  EXPECT_EQ(p.kind, Kind::kStop);
  EXPECT_NE(p.why.find("global_batch_size"), std::string::npos) << p.why;
}

TEST(RecoveryPolicy, GrowsBackWhenStandbysForAReplicaAreReady) {
  ClusterView v;
  v.topo = Topology(2, 2, 1);
  v.configured_dp = 2;
  v.workers_per_slot = 2;
  v.rank_slot = {0, 0, 2, 2};
  v.slots = {
      {0, SlotInfo::active}, {1, SlotInfo::standby}, {2, SlotInfo::active}, {3, SlotInfo::standby}};
  Options o = opts();
  o.recovery.set_on_no_standby(config::RecoveryConfig::shrink_dp);
  EXPECT_FALSE(decide_grow(v, holdings(4, 40), o));  // none ready yet
  v.ready_standbys = {1, 3};
  std::optional<Plan> p = decide_grow(v, holdings(4, 40), o);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->next_topo->dp(), 2);
  EXPECT_EQ(p->new_ranks, (std::vector<int>{2, 3, 6, 7}));
  EXPECT_EQ(p->renumber, (std::map<int, int>{{0, 0}, {1, 1}, {2, 4}, {3, 5}}));
  EXPECT_EQ(p->restore.step, 40);
  EXPECT_EQ(p->restore.sources.at(6), membership::replica);
  EXPECT_EQ(p->restore.sources.at(4), membership::memory);
}

TEST(RecoveryPolicy, RankAndItsHolderLostTogetherRestoreThePersistentCheckpoint) {
  ClusterView v = view_3d(2);
  v.slots[1] = SlotInfo::lost;
  v.slots[2] = SlotInfo::lost;
  // Rank 3 = (d1, p0, t1) on slot 1; its holder (d0, p1, t1) = rank 5, on slot 2.
  Failure f = slot_loss(v, {1, 2});
  std::map<int, Holdings> h = holdings(8, 30, f.dead);
  // What the survey finds: nothing on the lost slots.
  for (int r : {2, 3, 4, 5}) h[r].own.clear();
  Options o = opts();
  o.zero1 = true;  // replicas differ, so backups are pushed to (d+1, p+1, t)
  o.persistent_step = 20;
  Plan p = decide(f, v, h, o);
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.restore.step, 20);
  EXPECT_EQ(p.restore.job_source, membership::persistent);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(p.restore.sources.at(r), membership::persistent);
  EXPECT_NE(p.restore.why.find("rank 3"), std::string::npos) << p.restore.why;
  EXPECT_NE(p.restore.why.find("slot 2"), std::string::npos) << p.restore.why;
  EXPECT_NE(p.action.find("persistent checkpoint of step 20"), std::string::npos);
}

TEST(RecoveryPolicy, NothingLeftAndNoCheckpointStopsNamingTheLostRanks) {
  ClusterView v = view_3d(2);
  v.slots[1] = SlotInfo::lost;
  v.slots[2] = SlotInfo::lost;
  Failure f = slot_loss(v, {1, 2});
  std::map<int, Holdings> h = holdings(8, 30, f.dead);
  for (int r : {2, 3, 4, 5}) h[r].own.clear();
  Options pushed = opts();
  pushed.zero1 = true;
  Plan p = decide(f, v, h, pushed);
  EXPECT_EQ(p.kind, Kind::kStop);
  EXPECT_NE(p.why.find("rank 3"), std::string::npos) << p.why;
  EXPECT_NE(p.why.find("allow_restart_from_scratch"), std::string::npos) << p.why;

  Options o = pushed;
  o.recovery.set_allow_restart_from_scratch(true);
  Plan s = decide(f, v, h, o);
  ASSERT_EQ(s.kind, Kind::kRecover);
  EXPECT_EQ(s.restore.step, -1);
  EXPECT_EQ(s.restore.job_source, membership::scratch);
}

TEST(RecoveryPolicy, ABackupHeldOnAnEvictedSlotDoesNotCount) {
  ClusterView v = view_3d(1);
  // Rank 5 hangs on slot 2, which holds the backup of rank 3 (slot 1). Rank 3 crashed at the
  // same time and its own snapshot is gone: slot 2's eviction takes its last copy.
  Failure f;
  f.kind = FailureKind::kHang;
  f.culprit = 5;
  f.dead = {3, 5};
  std::map<int, Holdings> h = holdings(8, 9, f.dead);
  h[3].own.clear();
  Options pushed = opts();
  pushed.zero1 = true;  // backups pushed to (d+1, p+1, t)
  Plan p = decide(f, v, h, pushed);
  EXPECT_EQ(p.kind, Kind::kStop);
  EXPECT_NE(p.why.find("rank 3"), std::string::npos) << p.why;
  // With its own snapshot, rank 3 restores from it; rank 5 (moved) from its holder, rank 3.
  Plan q = decide(f, v, holdings(8, 9, f.dead), pushed);
  ASSERT_EQ(q.kind, Kind::kRecover) << q.why;
  EXPECT_EQ(q.restore.sources.at(3), membership::own_snapshot);
  EXPECT_EQ(q.restore.sources.at(5), membership::backup);
}

// Without ZeRO-1 a rank's backup is its DP replica's own snapshot (nothing pushed): two lost
// slots leave every rank a copy unless a rank and its replica were both on them.
TEST(RecoveryPolicy, WithoutZeroOneTheReplicaHoldsTheBackup) {
  ClusterView v = view_3d(2);
  v.slots[1] = SlotInfo::lost;
  v.slots[2] = SlotInfo::lost;
  // Ranks 2, 3 (d1, p0) on slot 1 and 4, 5 (d0, p1) on slot 2; their replicas 0, 1 and 6, 7
  // are on the slots that survive.
  Failure f = slot_loss(v, {1, 2});
  std::map<int, Holdings> h = holdings(8, 30, f.dead);
  for (int r : {2, 3, 4, 5}) h[r].own.clear();
  Plan p = decide(f, v, h, opts());
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_EQ(p.restore.step, 30);
  for (int r : {2, 3, 4, 5}) EXPECT_EQ(p.restore.sources.at(r), membership::backup) << r;

  // Rank 7 (slot 3) and its replica rank 5 (slot 2) lost together: memory cannot cover it.
  ClusterView w = view_3d(2);
  w.slots[2] = SlotInfo::lost;
  w.slots[3] = SlotInfo::lost;
  Failure g = slot_loss(w, {2, 3});
  std::map<int, Holdings> k = holdings(8, 30, g.dead);
  for (int r : {4, 5, 6, 7}) k[r].own.clear();
  Options o = opts();
  o.persistent_step = 20;
  Plan q = decide(g, w, k, o);
  ASSERT_EQ(q.kind, Kind::kRecover) << q.why;
  EXPECT_EQ(q.restore.step, 20);
  EXPECT_EQ(q.restore.job_source, membership::persistent);
}

TEST(RecoveryPolicy, CommErrorWithoutCulpritReattemptsInPlace) {
  ClusterView v = view_3d(1);
  Failure f;
  Plan p = decide(f, v, holdings(8, 7), opts());
  ASSERT_EQ(p.kind, Kind::kRecover);
  EXPECT_EQ(p.rung, PlanRung::kReattempt);
  EXPECT_TRUE(p.restart.empty());
  EXPECT_EQ(p.restore.step, 7);
}

TEST(RecoveryPolicy, InPlaceSlotLossFailsOrWaitsForTheSlot) {
  ClusterView v = view_3d(1);
  v.slots[1] = SlotInfo::lost;
  Options o = opts(config::RecoveryConfig::in_place);
  Plan p = decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), o);
  EXPECT_EQ(p.kind, Kind::kStop);
  EXPECT_NE(p.why.find("newest step every rank can restore is 30"), std::string::npos) << p.why;
  o.detect.set_on_slot_loss(config::DetectConfig::wait);
  EXPECT_EQ(decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), o).kind, Kind::kWait);
  v.slots[1] = SlotInfo::active;  // it came back
  Plan back = decide(slot_loss(v, {1}), v, holdings(8, 30, {2, 3}), o);
  ASSERT_EQ(back.kind, Kind::kRecover);
  EXPECT_EQ(back.restart, (std::set<int>{2, 3}));
}

TEST(RecoveryPolicy, RestartAllPlacesALostSlotOnAStandby) {
  ClusterView v = view_3d(1);
  v.slots[1] = SlotInfo::lost;
  Options o = opts(config::RecoveryConfig::restart_all);
  o.persistent_step = 40;
  Plan p = decide(slot_loss(v, {1}), v, holdings(8, 45, {2, 3}), o);
  ASSERT_EQ(p.kind, Kind::kRecover) << p.why;
  EXPECT_TRUE(p.restart_all);
  EXPECT_EQ(p.restart.size(), 8u);
  EXPECT_EQ(p.promote.at(1), 4);
  EXPECT_EQ(p.restore.step, 40);
  EXPECT_EQ(p.restore.job_source, membership::persistent);
}

TEST(RecoveryPolicy, RestartAllWithoutACheckpointStopsUnlessScratchIsAllowed) {
  ClusterView v = view_3d(1);
  Options o = opts(config::RecoveryConfig::restart_all);
  EXPECT_EQ(decide(crash(2), v, holdings(8, 5, {2}), o).kind, Kind::kStop);
  o.recovery.set_allow_restart_from_scratch(true);
  Plan p = decide(crash(2), v, holdings(8, 5, {2}), o);
  ASSERT_EQ(p.kind, Kind::kRecover);
  EXPECT_EQ(p.restore.step, -1);
  EXPECT_EQ(p.action, "restart all ranks from the start");
}

TEST(RecoveryPolicy, ASecondFailureDuringRecoveryIsDecidedTogether) {
  // Slot 1 was lost; while the job recovered, slot 3 went too: one decision for both, with
  // one standby only.
  ClusterView v = view_3d(1);
  v.slots[1] = SlotInfo::lost;
  v.slots[3] = SlotInfo::lost;
  Plan p = decide(slot_loss(v, {1, 3}), v, holdings(8, 30, {2, 3, 6, 7}), opts());
  EXPECT_EQ(p.kind, Kind::kStop);
  v.ready_standbys.insert(5);
  v.slots[5] = SlotInfo::standby;
  Plan two = decide(slot_loss(v, {1, 3}), v, holdings(8, 30, {2, 3, 6, 7}), opts());
  ASSERT_EQ(two.kind, Kind::kRecover) << two.why;
  EXPECT_EQ(two.promote, (std::map<int, int>{{1, 4}, {3, 5}}));
}

TEST(RecoveryPolicy, AbortDeadlineScalesWithTheStep) {
  config::RecoveryConfig rc;  // 5000 ms, 3 steps
  EXPECT_EQ(abort_deadline_ms(rc, 0.1), 5000);
  EXPECT_EQ(abort_deadline_ms(rc, 4.0), 12000);
  rc.set_abort_timeout_steps(5);
  EXPECT_EQ(abort_deadline_ms(rc, 2.0), 10000);
}

}  // namespace
}  // namespace keel::policy
