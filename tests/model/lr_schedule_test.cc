#include "model/lr_schedule.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(LrSchedule, WarmupThenCosineToFloor) {
  config::OptimConfig o;
  o.set_lr(1.0f);
  o.set_warmup_steps(4);
  o.set_min_lr_ratio(0.1f);
  o.set_schedule(config::OptimConfig::cosine);
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 20), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(o, 3, 20), 1.0);
  EXPECT_NEAR(learning_rate(o, 4, 20), 1.0, 1e-12);
  EXPECT_NEAR(learning_rate(o, 12, 20), 0.55, 1e-7);  // half-way: mean of lr and floor
  EXPECT_NEAR(learning_rate(o, 20, 20), 0.1, 1e-7);
  EXPECT_NEAR(learning_rate(o, 100, 20), 0.1, 1e-7);
}

TEST(LrSchedule, ConstantAfterWarmup) {
  config::OptimConfig o;
  o.set_lr(0.5f);
  o.set_warmup_steps(0);
  o.set_schedule(config::OptimConfig::constant);
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 10), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(o, 9, 10), 0.5);
}

}  // namespace
}  // namespace keel
