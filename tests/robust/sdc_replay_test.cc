// The dual-phase replay's groups and verdicts, without processes.
#include "robust/sdc_replay.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace keel::sdc {
namespace {

TEST(SdcReplay, ContiguousThenStridedGroupsMeetInOneMachine) {
  // TP2×PP2 on slots of two workers: a pipeline takes two machines; six machines, three groups.
  const ReplayPlan p = plan_replay({0, 1, 2, 3, 4, 5}, 4, 2);
  ASSERT_TRUE(p.why_not.empty()) << p.why_not;
  EXPECT_EQ(p.slots_per_group, 2);
  ASSERT_EQ(p.phases.size(), 2u);
  EXPECT_EQ(p.phases[0], (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_EQ(p.phases[1], (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2, 5}}));
  // Every contiguous group shares at most one machine with every strided group.
  for (const auto& a : p.phases[0])
    for (const auto& b : p.phases[1]) {
      int shared = 0;
      for (int m : a) shared += std::count(b.begin(), b.end(), m);
      EXPECT_LE(shared, 1);
    }
  // Machine 2 is defective: contiguous group 1 and strided group 2 fail.
  EXPECT_EQ(replay_culprits(p, {{1}, {2}}), std::vector<int>{2});
  // Only one phase saw it: nobody is named.
  EXPECT_TRUE(replay_culprits(p, {{1}, {}}).empty());
}

TEST(SdcReplay, LeftoverMachinesSitOutAndTooFewMachinesAreSaid) {
  const ReplayPlan p = plan_replay({3, 5, 7, 9, 11, 13, 15}, 2, 1);
  ASSERT_TRUE(p.why_not.empty());
  EXPECT_EQ(p.phases[0].size(), 3u);
  EXPECT_EQ(p.phases[1][0], (std::vector<int>{3, 9}));
  const ReplayPlan q = plan_replay({0, 1, 2, 3}, 4, 2);
  EXPECT_NE(q.why_not.find("needs three groups of 2 machines"), std::string::npos) << q.why_not;
}

TEST(SdcReplay, TheMinorityOfDigestsFailsAndATieDecidesNothing) {
  EXPECT_EQ(failing_groups({"a", "b", "a"}), (std::set<int>{1}));
  EXPECT_EQ(failing_groups({"a", "a", "a"}), std::set<int>{});
  EXPECT_EQ(failing_groups({"a", "", "a"}), (std::set<int>{1}));  // a group that did not run
  EXPECT_FALSE(failing_groups({"a", "b", "c"}).has_value());
  EXPECT_FALSE(failing_groups({"a", "b"}).has_value());
}

}  // namespace
}  // namespace keel::sdc
