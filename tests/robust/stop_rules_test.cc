// The stop rules (robust/stop_rules.h): max_incidents, and a failure that repeats without
// any progress between.
#include "robust/stop_rules.h"

#include <gtest/gtest.h>

namespace keel::policy {
namespace {

TEST(StopRules, StopsPastMaxIncidents) {
  StopMemory m;
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(count_failure(&m, 3, 10 * (i + 1)).stop) << i;
  const StopVerdict v = count_failure(&m, 3, 40);
  EXPECT_TRUE(v.stop);
  EXPECT_EQ(v.why, "4 incidents, more than recovery.max_incidents = 3");
  EXPECT_EQ(m.incidents, 4);
}

TEST(StopRules, ZeroMaxIncidentsStopsAtTheFirst) {
  StopMemory m;
  EXPECT_TRUE(count_failure(&m, 0, 5).stop);
}

// Two failures at the same progress are retried; the third in a row stops the job.
TEST(StopRules, AFailureRepeatingWithoutProgressStopsOnTheThird) {
  StopMemory m;
  EXPECT_FALSE(count_failure(&m, 100, 7).stop);
  EXPECT_FALSE(count_failure(&m, 100, 7).stop);
  const StopVerdict v = count_failure(&m, 100, 7);
  EXPECT_TRUE(v.stop);
  EXPECT_EQ(v.why,
            "the job completed no step since the last 2 recoveries, so this failure repeats");
}

TEST(StopRules, ProgressBetweenFailuresStartsTheCountOver) {
  StopMemory m;
  EXPECT_FALSE(count_failure(&m, 100, 7).stop);
  EXPECT_FALSE(count_failure(&m, 100, 7).stop);
  EXPECT_FALSE(count_failure(&m, 100, 8).stop);
  EXPECT_FALSE(count_failure(&m, 100, 8).stop);
  EXPECT_EQ(m.no_progress_incidents, 1);
  EXPECT_TRUE(count_failure(&m, 100, 8).stop);
}

// Before any step is known (-1), the first failure is no repeat of "nothing yet".
TEST(StopRules, UnknownProgressCountsAsAValue) {
  StopMemory m;
  EXPECT_FALSE(count_failure(&m, 100, -1).stop);
  EXPECT_FALSE(count_failure(&m, 100, -1).stop);
  EXPECT_TRUE(count_failure(&m, 100, -1).stop);
}

}  // namespace
}  // namespace keel::policy
