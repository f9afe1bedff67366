// The hang rules on fake snapshots: every branch (liveness, collective sequence, not in a
// collective, the point-to-point fallback, stacks), the guards (a slot loss, an epoch's first
// step, the job's end, a stall shorter than two steps + grace), and the details they print.
#include "robust/hang_rules.h"

#include <gtest/gtest.h>

#include "tests/test_expect.h"

namespace keel {
namespace {

// A job in step 50 of 100 whose ranks all report fresh and wait in no call; tests change
// what they need.
struct Job {
  HangSnapshot s;
  Job(int tp, int pp, int dp) {
    s.topology = Topology(tp, pp, dp);
    s.ranks.resize(size_t(s.topology.world_size()));
    for (int r = 0; r < s.topology.world_size(); ++r) {
      auto& rank = s.ranks[size_t(r)];
      rank.reported = true;
      rank.age_s = 0.1;
      rank.last.set_rank(r);
      rank.last.set_step(50);
      rank.last.set_step_s(0.5);
      rank.last.set_alive_at(1000);
    }
    s.epoch_start_step = 10;
    s.steps = 100;
    s.median_step_s = 0.5;
    s.liveness_timeout_s = 1.0;
    s.hang_grace_s = 1.5;
    s.stalled_s = 0.2;
  }
  // Stalled for longer than 2 steps + grace.
  Job& stall() {
    s.stalled_s = 2 * s.median_step_s + s.hang_grace_s + 0.5;
    return *this;
  }
  // Rank r's counts in `group`; entered > 0 also puts it inside a call.
  Job& seq(int r, const std::string& group, int64_t entered, int64_t finished) {
    auto* p = &s.ranks[size_t(r)].last;
    control::GroupSeq* g = nullptr;
    for (auto& x : *p->mutable_groups())
      if (x.group() == group) g = &x;
    if (!g) g = p->add_groups();
    g->set_group(group);
    g->set_entered(entered);
    g->set_finished(finished);
    g->set_since(entered ? 990 : 0);
    if (entered) in_call(r);
    return *this;
  }
  // Rank r waits in some call (a point-to-point one when no seq() says otherwise).
  Job& in_call(int r) {
    s.ranks[size_t(r)].last.set_in_collective(true);
    s.ranks[size_t(r)].last.set_in_collective_since(990);
    return *this;
  }
  HangVerdict verdict() const { return find_hang(s); }
};

TEST(HangRules, FormatsRankRuns) {
  EXPECT_EQ(format_ranks({}), "");
  EXPECT_EQ(format_ranks({3}), "3");
  EXPECT_EQ(format_ranks({7, 0, 1, 2, 4, 5, 6, 2}), "0-2,4-7");
  EXPECT_EQ(format_ranks({1, 5, 7}), "1,5,7");
  EXPECT_EQ(format_ranks({3, 4}), "3-4");
}

TEST(HangRules, RuleNames) {
  EXPECT_STREQ(hang_rule_name(HangRule::kNone), "none");
  EXPECT_STREQ(hang_rule_name(HangRule::kLiveness), "liveness");
  EXPECT_STREQ(hang_rule_name(HangRule::kCollectiveSequence), "collective_sequence");
  EXPECT_STREQ(hang_rule_name(HangRule::kNotInCollective), "not_in_collective");
}

TEST(HangRules, HealthyTrainingHasNoVerdict) {
  Job j(2, 1, 4);
  j.seq(0, "tp", 7, 6).seq(1, "tp", 7, 6);  // a collective in flight is normal
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNone);
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.detail, "");
  EXPECT_FALSE(v.capture_stacks);
}

TEST(HangRules, SilentRankWithALiveAgentIsFrozenWithoutAStall) {
  Job j(2, 1, 4);
  j.s.ranks[5].age_s = 1.24;
  HangVerdict v = j.verdict();  // stalled_s = 0.2: liveness needs no stall
  EXPECT_EQ(v.rule, HangRule::kLiveness);
  EXPECT_EQ(v.culprits, std::vector<int>{5});
  EXPECT_EQ(v.detail, "rank 5 stopped reporting 1.2 s ago while its agent is alive (frozen)");
  EXPECT_FALSE(v.capture_stacks);
}

TEST(HangRules, TwoSilentRanksAreBothCulprits) {
  Job j(2, 1, 4);
  j.s.ranks[3].age_s = 1.5;
  j.s.ranks[5].age_s = 2.0;
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kLiveness);
  EXPECT_EQ(v.culprits, (std::vector<int>{3, 5}));
  EXPECT_EQ(v.detail,
            "ranks 3,5 stopped reporting (1.5 s, 2.0 s ago) while their agents are alive "
            "(frozen)");
}

TEST(HangRules, SilenceUnderADeadAgentIsASlotLossNotAHang) {
  Job j(2, 1, 4);
  j.s.ranks[4].age_s = 5;
  j.s.ranks[5].age_s = 5;
  j.s.ranks[4].agent_alive = false;
  j.s.ranks[5].agent_alive = false;
  j.stall().seq(0, "tp", 9, 8);  // not even the stall rules speak
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNone);
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.detail, "the agents of ranks 4-5 are gone: a slot loss, not a hang");
  EXPECT_FALSE(v.capture_stacks);
}

TEST(HangRules, ALongStepIsNotAHang) {
  // A rank inside a long step: its step count is old but it reports from its own thread, so
  // its reports are fresh; the stall is shorter than two typical steps + grace.
  Job j(2, 1, 2);
  j.s.median_step_s = 3.0;
  j.s.stalled_s = 6.5;  // < 2 * 3.0 + 1.5
  j.seq(0, "dp", 12, 11).seq(2, "dp", 12, 11).seq(1, "tp", 0, 30).seq(3, "tp", 0, 30);
  j.s.ranks[1].last.set_step(49);  // behind by one, in compute
  j.seq(0, "tp", 31, 30);
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNone);
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_FALSE(v.capture_stacks);
  // The same picture past the threshold names the rank in compute.
  j.s.stalled_s = 8.0;
  v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNotInCollective);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
}

TEST(HangRules, NothingBeforeTheEpochsFirstStepOrAfterTheLast) {
  Job j(2, 1, 2);
  j.s.ranks[1].age_s = 5;  // would be a liveness culprit
  j.s.ranks[2].last.set_step(10);
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNone);
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_HAS(v.detail, "no step done in this epoch yet");

  for (auto& r : j.s.ranks) r.last.set_step(100);
  j.stall().seq(0, "world", 0, 200).seq(1, "world", 201, 200);
  v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNone);
  EXPECT_EQ(v.detail, "the job's last step is done");
  EXPECT_FALSE(v.capture_stacks);

  // The job's last step itself is still watched.
  for (auto& r : j.s.ranks) r.last.set_step(99);
  EXPECT_EQ(j.verdict().rule, HangRule::kLiveness);
}

TEST(HangRules, NothingUntilEveryRankReported) {
  Job j(2, 1, 2);
  j.s.ranks[3].reported = false;
  j.s.ranks[1].age_s = 5;
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNone);
  EXPECT_EQ(v.detail, "rank 3 has not reported in this epoch yet");
}

TEST(HangRules, RankStillInsideACollectiveItsPeersFinished) {
  // TP2 x DP4: rank 3 (tp 1) entered dp #412 and never left; its dp peers 1, 5, 7 finished
  // it and wait in the next one; the tp peers wait in world.
  Job j(2, 1, 4);
  j.stall();
  j.seq(3, "dp", 412, 411);
  for (int p : {1, 5, 7}) j.seq(p, "dp", 413, 412);
  for (int p : {0, 2, 4, 6}) j.seq(p, "dp", 0, 412).seq(p, "world", 60, 59);
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kCollectiveSequence);
  EXPECT_EQ(v.culprits, std::vector<int>{3});
  EXPECT_EQ(v.detail,
            "rank 3 is still inside dp collective #412, which its dp peers 1,5,7 finished");
  EXPECT_FALSE(v.capture_stacks);
}

TEST(HangRules, CollectiveSequenceComesBeforeNotInCollective) {
  // Rank 0 is held inside tp #5 (finished by rank 1); rank 2 is idle behind dp #3 too: the
  // cheaper-to-prove rule speaks first.
  Job j(2, 1, 2);
  j.stall();
  j.seq(0, "tp", 5, 4).seq(1, "tp", 6, 5);
  j.seq(2, "dp", 0, 2).seq(0, "dp", 0, 2).seq(3, "dp", 3, 2);
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kCollectiveSequence);
  EXPECT_EQ(v.culprits, std::vector<int>{0});
  EXPECT_EQ(v.detail, "rank 0 is still inside tp collective #5, which its tp peer 1 finished");
}

TEST(HangRules, RankThatHasNotEnteredTheCollectiveItsPeersWaitIn) {
  // TP4 x DP2: rank 3 never entered tp #41 (a hang before the call, or compute stuck).
  Job j(4, 1, 2);
  j.stall();
  for (int p : {0, 1, 2}) j.seq(p, "tp", 41, 40).seq(p, "world", 0, 50);
  j.seq(3, "tp", 0, 40).seq(3, "world", 0, 50);
  for (int p : {4, 5, 6, 7}) j.seq(p, "world", 51, 50);  // the other replica waits at the end
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNotInCollective);
  EXPECT_EQ(v.culprits, std::vector<int>{3});
  EXPECT_EQ(v.detail,
            "rank 3 has not entered tp collective #41, which its tp peers 0-2 wait in (ranks "
            "0-2,4-7 wait in communicator calls)");
}

TEST(HangRules, PeersWaitingInDifferentGroups) {
  // TP2 x PP2: stage 0 (ranks 0, 1) waits on a pp point-to-point receive from stage 1, and
  // rank 3's tp peer 2 waits in tp #17 that rank 3, spinning in compute, never entered.
  Job j(2, 2, 1);
  j.stall();
  j.in_call(0).in_call(1);
  j.seq(0, "pp", 0, 0).seq(1, "pp", 0, 0);  // p2p is not numbered
  j.seq(2, "tp", 17, 16).seq(3, "tp", 0, 16);
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNotInCollective);
  EXPECT_EQ(v.culprits, std::vector<int>{3});
  EXPECT_EQ(v.detail,
            "rank 3 has not entered tp collective #17, which its tp peer 2 waits in (ranks 0-2 "
            "wait in communicator calls)");
}

TEST(HangRules, PointToPointWaitsAloneNameTheOneIdleRank) {
  // PP4 with no collective in common: stages 0, 1, 3 wait on point-to-point calls, stage 2
  // loops in compute. (Stages 1 and 2 are in no embedding group.)
  Job j(1, 4, 1);
  j.stall();
  j.in_call(0).in_call(1).in_call(3);
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNotInCollective);
  EXPECT_EQ(v.culprits, std::vector<int>{2});
  EXPECT_EQ(v.detail,
            "rank 2 is the only rank outside every communicator call while ranks 0-1,3 wait");
}

TEST(HangRules, NoRuleNamesACulpritSoCaptureStacks) {
  // Everybody waits in point-to-point calls (a deadlock the numbers cannot explain).
  Job j(1, 2, 2);
  j.stall();
  for (int r = 0; r < 4; ++r) j.in_call(r);
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNone);
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_TRUE(v.capture_stacks);
  EXPECT_HAS(v.detail, "no rule names a culprit: capture the workers' stacks");

  // Two idle ranks and no sequence evidence: not a clear culprit either.
  Job k(1, 1, 4);
  k.stall().in_call(0).in_call(1);
  v = k.verdict();
  EXPECT_EQ(v.rule, HangRule::kNone);
  EXPECT_TRUE(v.capture_stacks);
}

TEST(HangRules, NoStallRulesWithoutAGrace) {
  Job j(2, 1, 1);
  j.s.hang_grace_s = 0;
  j.s.stalled_s = 1000;
  j.seq(0, "tp", 5, 4).seq(1, "tp", 0, 4);
  EXPECT_EQ(j.verdict().rule, HangRule::kNone);
  EXPECT_FALSE(j.verdict().capture_stacks);
  j.s.ranks[1].age_s = 3;  // liveness still works
  EXPECT_EQ(j.verdict().rule, HangRule::kLiveness);
}

// hang_possible is the controller's cheap test before it builds a snapshot: whenever
// find_hang names a culprit or asks for stacks, it must have said possible. Swept over ages,
// stalls, graces and step times, for a healthy job, one behind in a collective and a deadlock.
TEST(HangRules, NoVerdictWhereHangPossibleSaysNone) {
  int verdicts = 0;
  for (int shape = 0; shape < 3; ++shape)
    for (double age : {0.1, 0.9, 1.0, 1.1, 3.0})
      for (double stalled : {0.2, 1.4, 1.5, 1.6, 2.6, 10.0})
        for (double grace : {0.0, 1.5})
          for (double median : {0.0, 0.5}) {
            Job j(2, 1, 2);
            if (shape == 1) j.seq(0, "tp", 5, 4).seq(1, "tp", 0, 5);
            if (shape == 2)
              for (int r = 0; r < 4; ++r) j.in_call(r);
            j.s.ranks[1].age_s = age;
            j.s.stalled_s = stalled;
            j.s.hang_grace_s = grace;
            j.s.median_step_s = median;
            const HangVerdict v = j.verdict();
            if (v.culprits.empty() && !v.capture_stacks) continue;
            ++verdicts;
            EXPECT_TRUE(hang_possible(age, stalled, j.s.liveness_timeout_s, grace))
                << "shape " << shape << " age " << age << " stalled " << stalled << " grace "
                << grace << " median " << median << ": " << v.detail;
          }
  EXPECT_GT(verdicts, 50);  // the sweep reaches every rule
  // Fresh reports, no stall: nothing to look at.
  EXPECT_FALSE(hang_possible(0.2, 0.3, 1.0, 1.5));
  EXPECT_TRUE(hang_possible(1.2, 0.3, 1.0, 1.5));
  EXPECT_TRUE(hang_possible(0.2, 1.5, 1.0, 1.5));
  EXPECT_FALSE(hang_possible(0.2, 100, 1.0, 0));
}

TEST(HangRules, TwoRanksBehindAtOnce) {
  // TP2 x DP2: rank 1 never entered tp #8 of its group (its peer 0 waits), rank 2 never
  // entered tp #8 of the other (its peer 3 waits): both are named.
  Job j(2, 1, 2);
  j.stall();
  j.seq(0, "tp", 8, 7).seq(1, "tp", 0, 7);
  j.seq(3, "tp", 8, 7).seq(2, "tp", 0, 7);
  HangVerdict v = j.verdict();
  EXPECT_EQ(v.rule, HangRule::kNotInCollective);
  EXPECT_EQ(v.culprits, (std::vector<int>{1, 2}));
  EXPECT_EQ(v.detail,
            "rank 1 has not entered tp collective #8, which its tp peer 0 waits in; rank 2 has "
            "not entered tp collective #8, which its tp peer 3 waits in (ranks 0,3 wait in "
            "communicator calls)");
}

TEST(HangRules, SnapshotMustMatchTheTopology) {
  HangSnapshot s;
  s.topology = Topology(2, 1, 1);
  s.ranks.resize(1);
  EXPECT_THROW(find_hang(s), Error);
}

}  // namespace
}  // namespace keel
