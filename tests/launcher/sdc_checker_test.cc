// The SdcChecker's bookkeeping (launcher/worker/sdc_checker.h) through its public interface:
// what the checks cover on a layout, which injected corruptions they missed and why, their
// share of the time, and that SdcFound ends an epoch without being a CommError.
#include "launcher/worker/sdc_checker.h"

#include <gtest/gtest.h>

#include "parallel/comm_error.h"

namespace keel {
namespace {

SdcChecker checker(int every) {
  return SdcChecker(every, /*zero1=*/false, /*injected=*/true, [] { return GoldenCheckResult{}; });
}

TEST(SdcChecker, CoverageSaysWhatTheLayoutAllows) {
  EXPECT_EQ(checker(0).coverage(Topology(1, 1, 2), true), "off (sdc.check_every_steps = 0)");
  const std::string dp2 = checker(5).coverage(Topology(1, 1, 2), true);
  EXPECT_EQ(dp2.rfind("every 5 steps: recompute", 0), 0u) << dp2;
  EXPECT_NE(dp2.find("agreement (parameters, moments)"), std::string::npos) << dp2;
  EXPECT_NE(dp2.find("; at rest"), std::string::npos) << dp2;
  const std::string dp1 = checker(5).coverage(Topology(2, 1, 1), false);
  EXPECT_NE(dp1.find("no DP replica"), std::string::npos) << dp1;
  EXPECT_EQ(dp1.find("at rest"), std::string::npos) << dp1;
  const std::string zero1 = SdcChecker(5, true, false, [] {
                              return GoldenCheckResult{};
                            }).coverage(Topology(1, 1, 2), true);
  EXPECT_NE(zero1.find("moments are ZeRO-1 shards, not compared"), std::string::npos) << zero1;
}

TEST(SdcChecker, MissedInjectionsAreNamedWithWhy) {
  std::vector<InjectionRecord> in = {{"sdc", 1, 2, 0.0}, {"sdc", 0, 9, 0.0}, {"crash", 0, 3, 0.0}};
  report::RunReport rep;
  report::Incident* caught = rep.add_incidents();
  caught->set_kind("sdc");
  caught->set_rank(0);
  caught->set_step(9);
  const std::vector<std::string> m = checker(5).missed(in, rep, Topology(1, 1, 2));
  ASSERT_EQ(m.size(), 1u);  // rank 0's was caught, the crash is no sdc
  EXPECT_EQ(m[0].rfind("sdc on rank 1 at step 3: no check covered it", 0), 0u) << m[0];
  EXPECT_EQ(checker(0).missed(in, rep, Topology(1, 1, 2))[0],
            "sdc on rank 1 at step 3: the checks are off");
  EXPECT_EQ(checker(5).missed(in, rep, Topology(2, 1, 1))[0],
            "sdc on rank 1 at step 3: no DP replica to compare with (only state at rest is "
            "checked)");
}

TEST(SdcChecker, StartsWithNothingVerifiedAndNoShare) {
  SdcChecker c = checker(4);
  EXPECT_EQ(c.every(), 4);
  EXPECT_TRUE(c.injected());
  EXPECT_EQ(c.last_passed(), -1);
  EXPECT_EQ(c.seconds(), 0);
  EXPECT_EQ(c.share(), 0);
  c.step_done(2.0);
  EXPECT_EQ(c.share(), 0);  // no check ran yet
  EXPECT_EQ(c.take_before_step_seconds(), 0);
}

TEST(SdcChecker, CorruptionFoundEndsTheEpochButIsNoCommError) {
  const SdcFound e("step 3: rank 1 differs");
  EXPECT_TRUE(ends_epoch(e));
  EXPECT_EQ(dynamic_cast<const CommError*>(static_cast<const std::exception*>(&e)), nullptr);
  EXPECT_TRUE(ends_epoch(CommError("a peer died")));
  EXPECT_FALSE(ends_epoch(Error("a bug")));
}

}  // namespace
}  // namespace keel
