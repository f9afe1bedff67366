// The SDC check's decisions, without processes: the rotation, and what every pattern of
// digests means (TP2×PP2×DP2 and DP3 layouts; rank = tp + dp·T + pp·T·D).
#include "robust/sdc_check.h"

#include <gtest/gtest.h>

namespace keel::sdc {
namespace {

constexpr uint64_t kGood = 0x600d, kBad = 0xbad;

// Every rank agrees: own and recomputed digests equal, identical state, nothing at rest.
std::vector<RankReport> clean(const Topology& topo) {
  std::vector<RankReport> r(size_t(topo.world_size()));
  for (int k = 0; k < topo.world_size(); ++k) {
    const Coord c = topo.coord(k);
    const uint64_t shard = uint64_t(c.pp * 10 + c.tp);  // differs by coordinate, not replica
    r[size_t(k)].own = {shard + kGood, shard + 2 * kGood};
    r[size_t(k)].recomputed = r[size_t(k)].own;
    r[size_t(k)].params = shard + 100;
    r[size_t(k)].m = shard + 200;
    r[size_t(k)].v = shard + 300;
    r[size_t(k)].at_rest_known = true;
  }
  return r;
}

// Rank `bad` computes its gradients wrong: its own micro-batch, and (persistent) whatever it
// recomputes.
void wrong_grad(const Topology& topo, std::vector<RankReport>& r, int bad, bool persistent) {
  r[size_t(bad)].own.grad ^= kBad;
  if (persistent) r[size_t(bad)].recomputed.grad ^= kBad;
  (void)topo;
}

TEST(SdcCheck, ChecksRunEveryNStepsAndTheRotationVisitsEveryPartner) {
  EXPECT_FALSE(is_check_step(8, 10));
  EXPECT_TRUE(is_check_step(9, 10));
  EXPECT_FALSE(is_check_step(9, 0));
  EXPECT_EQ(check_index(19, 10), 1);
  EXPECT_EQ(recompute_target(0, 1, 0), -1);
  EXPECT_EQ(recompute_target(0, 2, 0), 1);
  EXPECT_EQ(recompute_target(1, 2, 5), 0);
  // DP4: offsets 1, 2, 3, 1, ...; never itself.
  std::set<int> seen;
  for (int k = 0; k < 3; ++k) {
    const int t = recompute_target(0, 4, k);
    EXPECT_NE(t, 0);
    seen.insert(t);
  }
  EXPECT_EQ(seen, (std::set<int>{1, 2, 3}));
}

TEST(SdcCheck, ReportsSurviveTheFloatPacking) {
  RankReport a;
  a.own = {1, 2};
  a.recomputed = {3, 0xFFFFFFFFFFFFFFFFull};
  a.params = 0x7FC00000;  // a NaN's bits as a float: must not be canonicalised
  a.m = 6;
  a.v = 7;
  a.at_rest_known = true;
  a.at_rest_ok = false;
  float f[RankReport::kFloats];
  a.pack(f);
  const RankReport b = RankReport::unpack(f);
  EXPECT_EQ(b.own, a.own);
  EXPECT_EQ(b.recomputed, a.recomputed);
  EXPECT_EQ(b.params, a.params);
  EXPECT_EQ(b.v, a.v);
  EXPECT_TRUE(b.at_rest_known);
  EXPECT_FALSE(b.at_rest_ok);
}

TEST(SdcCheck, AgreeingDigestsAreClean) {
  const Topology topo(2, 2, 2);
  const Verdict v = judge(topo, 0, clean(topo), false);
  EXPECT_TRUE(v.clean) << v.detail;
  EXPECT_TRUE(v.culprits.empty());
}

TEST(SdcCheck, TwoReplicasThatDisagreeAskTheTargetsToRecomputeThenTheGoldenCheck) {
  const Topology topo(2, 2, 2);
  std::vector<RankReport> r = clean(topo);
  wrong_grad(topo, r, 5, /*persistent=*/true);
  const Verdict v = judge(topo, 0, r, false);
  EXPECT_FALSE(v.clean);
  EXPECT_TRUE(v.culprits.empty()) << v.detail;
  EXPECT_EQ(v.suspects, (std::set<int>{5, 7}));  // (d0,p1,t1) and (d1,p1,t1)
  EXPECT_EQ(v.recheck_replicas, (std::set<int>{0, 1}));
  EXPECT_EQ(v.tensor_class, "grad");
  // A defective unit repeats itself: still a tie, so the golden check decides.
  std::vector<MicroBatchDigest> again(8);
  again[5] = r[5].own;
  again[7] = r[7].own;
  const Verdict w = judge_recheck(topo, 0, r, again, v);
  EXPECT_TRUE(w.culprits.empty()) << w.detail;
  EXPECT_TRUE(w.golden);
  std::vector<uint64_t> golden(8, 42);
  golden[5] = 43;
  const Verdict g = judge_golden(w, golden, std::nullopt);
  EXPECT_EQ(g.culprits, std::vector<int>{5}) << g.detail;
  EXPECT_EQ(g.how, "golden");
  // The repo's digest wins over a majority only when most ranks agree with it.
  EXPECT_EQ(judge_golden(w, golden, 42).culprits, std::vector<int>{5});
  EXPECT_EQ(judge_golden(w, golden, 7).culprits, std::vector<int>{5});
  // Nobody fails the golden check: no clear culprit.
  const Verdict none = judge_golden(w, std::vector<uint64_t>(8, 42), std::nullopt);
  EXPECT_FALSE(none.clean);
  EXPECT_TRUE(none.culprits.empty());
  EXPECT_NE(none.detail.find("no clear culprit"), std::string::npos) << none.detail;
}

TEST(SdcCheck, ATransientFlipIsNamedWhenTheTargetsRecomputationAgreesWithItsChecker) {
  const Topology topo(2, 2, 2);
  std::vector<RankReport> r = clean(topo);
  wrong_grad(topo, r, 5, /*persistent=*/false);
  const Verdict v = judge(topo, 0, r, false);
  ASSERT_EQ(v.recheck_replicas, (std::set<int>{0}));  // only rank 5's replica is a target
  std::vector<MicroBatchDigest> again(8);
  for (int k : {0, 1, 4, 5}) again[size_t(k)] = r[size_t(k)].recomputed;
  again[5] = r[7].recomputed;  // rank 5 now computes what its checker computed
  const Verdict w = judge_recheck(topo, 0, r, again, v);
  EXPECT_EQ(w.culprits, std::vector<int>{5}) << w.detail;
  EXPECT_EQ(w.how, "recompute_again");
}

TEST(SdcCheck, ACheckerAloneAtOddsWithATargetThatRepeatsItselfIsNamed) {
  const Topology topo(1, 1, 3);
  std::vector<RankReport> r = clean(topo);
  // Check 0: d checks d+1. Rank 0's recomputation of rank 1's micro-batch is wrong, once.
  r[0].recomputed.grad ^= kBad;
  const Verdict v = judge(topo, 0, r, false);
  ASSERT_EQ(v.recheck_replicas, (std::set<int>{1}));
  std::vector<MicroBatchDigest> again(3);
  again[1] = r[1].own;
  const Verdict w = judge_recheck(topo, 0, r, again, v);
  EXPECT_EQ(w.culprits, std::vector<int>{0}) << w.detail;
}

TEST(SdcCheck, WithThreeReplicasTheRankInEveryMismatchIsNamedAtOnce) {
  const Topology topo(1, 1, 3);
  std::vector<RankReport> r = clean(topo);
  wrong_grad(topo, r, 1, /*persistent=*/true);
  const Verdict v = judge(topo, 0, r, false);
  EXPECT_EQ(v.culprits, std::vector<int>{1}) << v.detail;
  EXPECT_EQ(v.how, "recompute");
  EXPECT_TRUE(v.recheck_replicas.empty());
}

TEST(SdcCheck, ACorruptActivationIsPinnedAtTheStageWhereItEntered) {
  const Topology topo(2, 2, 3);
  std::vector<RankReport> r = clean(topo);
  // Rank (d1, p0, t1) = 1 + 1·2 + 0 = 3 sends a wrong activation: its own activation digest and
  // its recomputations differ, and every later stage of replica 1 computes different gradients.
  r[3].own.activation ^= kBad;
  r[3].recomputed.activation ^= kBad;
  for (int k = 0; k < topo.world_size(); ++k)
    if (topo.coord(k).dp == 1 && topo.coord(k).pp == 1) r[size_t(k)].own.grad ^= kBad;
  const Verdict v = judge(topo, 0, r, false);
  EXPECT_EQ(v.culprits, std::vector<int>{3}) << v.detail;
  EXPECT_EQ(v.tensor_class, "activation");
}

TEST(SdcCheck, StateThatChangedAtRestNamesItsRank) {
  const Topology topo(2, 2, 2);
  std::vector<RankReport> r = clean(topo);
  r[6].m ^= kBad;           // (d1, p1, t0): its moment differs from replica 0's ...
  r[6].at_rest_ok = false;  // ... and from what its snapshot committed
  const Verdict v = judge(topo, 0, r, false);
  EXPECT_EQ(v.culprits, std::vector<int>{6}) << v.detail;
  EXPECT_EQ(v.how, "at_rest");
  EXPECT_EQ(v.tensor_class, "optimizer");
}

TEST(SdcCheck, AgreementNamesTheMinorityAndTiesGoToTheGoldenCheck) {
  const Topology topo(1, 1, 3);
  std::vector<RankReport> r = clean(topo);
  r[2].params ^= kBad;
  for (auto& x : r) x.at_rest_known = false;
  Verdict v = judge(topo, 0, r, false);
  EXPECT_EQ(v.culprits, std::vector<int>{2}) << v.detail;
  EXPECT_EQ(v.how, "agreement");
  EXPECT_EQ(v.tensor_class, "param");

  const Topology two(1, 1, 2);
  std::vector<RankReport> t = clean(two);
  t[1].params ^= kBad;
  v = judge(two, 0, t, false);
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_TRUE(v.golden) << v.detail;
  EXPECT_EQ(v.suspects, (std::set<int>{0, 1}));
  // Two ranks in all: no majority of golden digests, but the repo's digest decides.
  EXPECT_TRUE(judge_golden(v, {42, 43}, std::nullopt).culprits.empty());
  EXPECT_EQ(judge_golden(v, {42, 43}, 42).culprits, std::vector<int>{1});
  EXPECT_TRUE(judge_golden(v, {41, 41}, 42).culprits.empty());  // a stale table names nobody
}

TEST(SdcCheck, ZeroOneShardsMomentsSoOnlyParametersAreCompared) {
  const Topology topo(1, 1, 2);
  std::vector<RankReport> r = clean(topo);
  r[1].m ^= kBad;  // each replica holds its own shard of the moments
  r[1].v ^= kBad;
  EXPECT_TRUE(judge(topo, 0, r, /*zero1=*/true).clean);
  EXPECT_FALSE(judge(topo, 0, r, /*zero1=*/false).clean);
}

TEST(SdcCheck, OneReplicaHasNoRecomputeOrAgreementButAtRestStillNames) {
  const Topology topo(2, 1, 1);
  std::vector<RankReport> r = clean(topo);
  r[1].own.grad ^= kBad;  // nobody to compare with
  EXPECT_TRUE(judge(topo, 0, r, false).clean);
  r[1].at_rest_ok = false;
  const Verdict v = judge(topo, 0, r, false);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.tensor_class, "state");
}

}  // namespace
}  // namespace keel::sdc
