// The hot update's probation, without processes.
#include "robust/update_probation.h"

#include <gtest/gtest.h>

namespace keel::update {
namespace {

TEST(UpdateProbation, LastsProbationStepsFromTheSwitch) {
  EXPECT_TRUE(on_probation(100, 100, 50));
  EXPECT_TRUE(on_probation(100, 149, 50));
  EXPECT_FALSE(on_probation(100, 150, 50));
  EXPECT_FALSE(on_probation(-1, 0, 50));  // nothing applied
  EXPECT_FALSE(on_probation(100, 100, 0));
}

TEST(UpdateProbation, TheLossLimitIsAJumpOverTheMeanBefore) {
  EXPECT_FALSE(loss_limit({}, 1.0f));
  EXPECT_DOUBLE_EQ(*loss_limit({2.0, 4.0}, 1.0f), 6.0);
  EXPECT_DOUBLE_EQ(*loss_limit({3.0}, 0.5f), 4.5);
  EXPECT_FALSE(loss_limit({0.0, 0.0}, 1.0f));  // nothing to compare with
}

}  // namespace
}  // namespace keel::update
