// Tests for runtime/rng.h: Philox known answers and the statistics and purity of draws.
#include "runtime/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace keel::rng {
namespace {

// Known-answer vectors of Random123's philox4x32_10 (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (Counter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(
      philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      (Counter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(
      philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      (Counter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Rng, DrawsArePureFunctionsOfTheirArguments) {
  const uint64_t s = stream("init", 3, 7);
  EXPECT_EQ(s, stream("init", 3, 7));
  EXPECT_NE(s, stream("init", 3, 8));
  EXPECT_NE(s, stream("dropout", 3, 7));
  // A draw does not depend on what was drawn before it.
  const float first = normal(42, s, 1000);
  for (uint64_t i = 0; i < 100; ++i) normal(42, s, i);
  EXPECT_EQ(first, normal(42, s, 1000));
  EXPECT_EQ(bits(42, s, 5), bits(42, s, 5));
  EXPECT_NE(bits(42, s, 5), bits(43, s, 5));
  EXPECT_NE(bits(42, s, 5), bits(42, s, 6));
}

TEST(Rng, UniformIsInRangeAndDistinct) {
  const uint64_t s = stream("uniform");
  std::set<float> seen;
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    float u = uniform(1, s, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    if (i < 1000) seen.insert(u);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);  // 5 standard errors of the mean (0.29/sqrt(n))
  EXPECT_GT(seen.size(), 990u);
}

TEST(Rng, NormalHasMeanZeroAndStdOne) {
  const uint64_t s = stream("normal", 1);
  const int n = 100000;
  double sum = 0, sum_sq = 0, sum_4 = 0;
  for (int i = 0; i < n; ++i) {
    double x = normal(2024, s, i);
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sum_sq += x * x;
    sum_4 += x * x * x * x;
  }
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  // Standard errors at n = 1e5: mean 0.0032, variance 0.0045, fourth moment 0.03.
  EXPECT_NEAR(mean, 0.0, 0.016);
  EXPECT_NEAR(std::sqrt(var), 1.0, 0.012);
  EXPECT_NEAR(sum_4 / n, 3.0, 0.15);  // a Gaussian's kurtosis, not just any unit variance
}

}  // namespace
}  // namespace keel::rng
