// The escalation ladder (climb) and the fail-slow decisions of robust/recovery_policy.h, with
// the fake TP2×PP2×DP2 membership of recovery_policy_test.cc: ranks 2k, 2k+1 on slot k.
#include <gtest/gtest.h>

#include "robust/ladder.h"

namespace keel::policy {
namespace {

using membership::SlotInfo;

ClusterView view_3d(int standbys_ready) {
  ClusterView v;
  v.topo = Topology(2, 2, 2);
  v.configured_dp = 2;
  v.workers_per_slot = 2;
  for (int r = 0; r < 8; ++r) v.rank_slot.push_back(r / 2);
  for (int s = 0; s < 4; ++s) v.slots[s] = SlotInfo::active;
  for (int k = 0; k < standbys_ready; ++k) {
    v.slots[4 + k] = SlotInfo::standby;
    v.ready_standbys.insert(4 + k);
  }
  return v;
}

std::map<int, Holdings> holdings(int64_t S) {
  std::map<int, Holdings> h;
  for (int r = 0; r < 8; ++r) {
    h[r].live = S;
    h[r].own = {S - 1, S};
    h[r].backup = {S - 1, S};
  }
  return h;
}

Options opts(int64_t persistent_step = -1) {
  Options o;
  o.recovery.set_mode(config::RecoveryConfig::hot_swap);
  o.recovery.set_repeat_window_steps(100);
  o.micro_batch = 1;
  o.global_batch = 4;
  o.persistent_step = persistent_step;
  return o;
}

Failure no_culprit() {
  Failure f;
  f.kind = FailureKind::kCommError;
  f.rule = "comm_error";
  return f;
}

TEST(Ladder, ACulpritIsRungOneAndLeavesNoMemory) {
  LadderMemory m;
  Failure f;
  f.kind = FailureKind::kCrash;
  f.culprit = 3;
  f.dead = {3};
  EXPECT_EQ(climb(f, 50, &m, opts()).rung, Rung::kCulprit);
  EXPECT_TRUE(m.culpritless.empty());
  // Neither does a slow rank, or a hang.
  f.kind = FailureKind::kSlow;
  f.dead.clear();
  EXPECT_EQ(climb(f, 60, &m, opts()).rung, Rung::kCulprit);
}

TEST(Ladder, NoCulpritDiagnosesThenRollsBackThenReplays) {
  LadderMemory m;
  const Options o = opts(/*persistent_step=*/40);
  EXPECT_EQ(climb(no_culprit(), 50, &m, o).rung, Rung::kDiagnose);
  const LadderStep again = climb(no_culprit(), 60, &m, o);
  EXPECT_EQ(again.rung, Rung::kRollback);
  EXPECT_FALSE(again.plugin_rollback);
  EXPECT_NE(again.why.find("persistent checkpoint of step 40"), std::string::npos) << again.why;
  const LadderStep third = climb(no_culprit(), 65, &m, o);
  EXPECT_EQ(third.rung, Rung::kReplay);
  EXPECT_NE(third.why.find("third time"), std::string::npos) << third.why;
}

TEST(Ladder, AFailureOutsideTheWindowStartsOver) {
  LadderMemory m;
  const Options o = opts(40);
  EXPECT_EQ(climb(no_culprit(), 50, &m, o).rung, Rung::kDiagnose);
  EXPECT_EQ(climb(no_culprit(), 151, &m, o).rung, Rung::kDiagnose);  // 101 steps later
  EXPECT_EQ(climb(no_culprit(), 200, &m, o).rung, Rung::kRollback);
}

TEST(Ladder, ARecentUpdateIsRolledBackRatherThanTheCheckpoint) {
  LadderMemory m;
  m.update_applied_step = 30;
  const Options o = opts(40);
  climb(no_culprit(), 50, &m, o);
  const LadderStep s = climb(no_culprit(), 55, &m, o);
  EXPECT_EQ(s.rung, Rung::kRollback);
  EXPECT_TRUE(s.plugin_rollback);
  // An update long before the window does not count.
  LadderMemory old;
  old.update_applied_step = 5;
  climb(no_culprit(), 150, &old, o);
  EXPECT_FALSE(climb(no_culprit(), 155, &old, o).plugin_rollback);
}

TEST(Ladder, NothingToRollBackToGoesToTheReplay) {
  LadderMemory m;
  climb(no_culprit(), 50, &m, opts(-1));
  EXPECT_EQ(climb(no_culprit(), 55, &m, opts(-1)).rung, Rung::kReplay);
}

TEST(Ladder, AZeroWindowNeverRepeats) {
  LadderMemory m;
  Options o = opts(40);
  o.recovery.set_repeat_window_steps(0);
  for (int64_t s : {50, 50, 51}) EXPECT_EQ(climb(no_culprit(), s, &m, o).rung, Rung::kDiagnose);
}

TEST(Ladder, UnpinnedCorruptionAndAFailedProbationHaveTheirRungs) {
  LadderMemory m;
  Failure sdc;
  sdc.kind = FailureKind::kSdc;
  EXPECT_EQ(climb(sdc, 50, &m, opts()).rung, Rung::kReplay);
  Failure probation = no_culprit();
  probation.rule = "probation";
  const LadderStep s = climb(probation, 50, &m, opts());
  EXPECT_EQ(s.rung, Rung::kRollback);
  EXPECT_TRUE(s.plugin_rollback);
}

TEST(Ladder, SlotsThatFailedTheDiagnosticsAreEvicted) {
  Failure f = no_culprit();
  f.diagnosed = true;
  f.failed_slots = {2};
  const Plan p = decide(f, view_3d(1), holdings(50), opts());
  ASSERT_EQ(p.kind, Plan::Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kEvict);
  EXPECT_EQ(p.evict, std::vector<int>({2}));
  EXPECT_EQ(p.promote.at(2), 4);
  EXPECT_EQ(p.kill, std::set<int>({4, 5}));  // alive, parked: stopped first
  EXPECT_EQ(p.restore.step, 50);
}

TEST(Ladder, PassedDiagnosticsReattempt) {
  Failure f = no_culprit();
  f.diagnosed = true;
  const Plan p = decide(f, view_3d(1), holdings(50), opts());
  EXPECT_EQ(p.rung, PlanRung::kReattempt);
  EXPECT_NE(p.why.find("diagnostics passed"), std::string::npos) << p.why;
  EXPECT_TRUE(p.restart.empty());
}

TEST(Ladder, RollbackRestoresThePersistentCheckpointInPlace) {
  Failure f = no_culprit();
  f.from_checkpoint = true;
  f.ladder_why = "the same failure again";
  const Plan p = decide(f, view_3d(1), holdings(50), opts(/*persistent_step=*/40));
  ASSERT_EQ(p.kind, Plan::Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kRollback);
  EXPECT_EQ(p.restore.step, 40);
  EXPECT_EQ(p.restore.job_source, membership::persistent);
  EXPECT_TRUE(p.restart.empty());
}

TEST(FailSlow, ADegraderIsEvictedToAReadyStandby) {
  Failure f;
  f.kind = FailureKind::kSlow;
  f.culprit = 5;
  const Plan p = decide(f, view_3d(1), holdings(120), opts());
  ASSERT_EQ(p.kind, Plan::Kind::kRecover) << p.why;
  EXPECT_EQ(p.rung, PlanRung::kEvict);
  EXPECT_EQ(p.promote.at(2), 4);
  EXPECT_EQ(p.kill, std::set<int>({4, 5}));
  EXPECT_EQ(p.restore.step, 120);
}

TEST(FailSlow, EvictOnlyWithAStandbyAndNeverTheControllersSlot) {
  Options o = opts();
  EXPECT_TRUE(decide_slow(5, view_3d(1), o).evict);
  const SlowAction none = decide_slow(5, view_3d(0), o);
  EXPECT_FALSE(none.evict);
  EXPECT_NE(none.why.find("no standby"), std::string::npos) << none.why;
  EXPECT_FALSE(decide_slow(1, view_3d(1), o).evict);  // slot 0, the controller's (mpirun)
  // A controller in a process of its own (keel-launch): slot 0 is a slot like any other.
  ClusterView own = view_3d(1);
  own.controller_slot = -1;
  EXPECT_TRUE(decide_slow(1, own, o).evict);
  o.detect.set_on_slow(config::DetectConfig::warn);
  const SlowAction warn = decide_slow(5, view_3d(1), o);
  EXPECT_FALSE(warn.evict);
  EXPECT_NE(warn.why.find("warn"), std::string::npos) << warn.why;
}

}  // namespace
}  // namespace keel::policy
