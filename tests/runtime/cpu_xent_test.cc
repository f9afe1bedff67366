// The CPU backend's three-pass vocab-parallel cross-entropy: against a double reference, split
// over two simulated TP ranks (row_max combined with max, sum_exp and target_logit with +, as
// the runtime's all-reduces do), with padding columns, and with dlogits aliasing logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/backend.h"
#include "runtime/check.h"
#include "tests/runtime/cpu_test_util.h"

namespace keel {
namespace {

using test::all_close;
using test::random_floats;

constexpr int kN = 37, kVocab = 45, kPadded = 48;  // three padding columns
constexpr float kScale = 0.25f;

struct Xent {
  std::vector<float> losses, dlogits;
};

// One TP rank's share of the three passes, with the all-reduces done by the caller.
struct Shard {
  int begin, width;
  std::vector<float> logits, row_max, sum_exp, target_logit;
};

Xent reference(const std::vector<float>& logits, const std::vector<int32_t>& targets) {
  Xent out{std::vector<float>(kN), std::vector<float>(logits.size())};
  for (int i = 0; i < kN; ++i) {
    const float* row = logits.data() + size_t(i) * kPadded;
    double mx = -INFINITY, z = 0;
    for (int j = 0; j < kVocab; ++j) mx = std::max(mx, double(row[j]));
    for (int j = 0; j < kVocab; ++j) z += std::exp(row[j] - mx);
    out.losses[i] = float(std::log(z) + mx - row[targets[i]]);
    for (int j = 0; j < kVocab; ++j) {
      out.dlogits[size_t(i) * kPadded + j] =
          float(kScale * (std::exp(row[j] - mx) / z - (j == targets[i] ? 1.0 : 0.0)));
    }
  }
  return out;
}

// Runs the three passes over `shards` of one [kN, kPadded] logits matrix and returns the
// losses (which every shard must agree on) and the shards' dlogits side by side.
Xent run_sharded(Backend& be, const std::vector<float>& logits, const std::vector<int32_t>& targets,
                 const std::vector<int>& widths, bool in_place) {
  std::vector<Shard> shards;
  int begin = 0;
  for (int w : widths) {
    Shard s{begin,
            w,
            std::vector<float>(size_t(kN) * w),
            std::vector<float>(kN),
            std::vector<float>(kN),
            std::vector<float>(kN)};
    for (int i = 0; i < kN; ++i) {
      std::copy_n(logits.data() + size_t(i) * kPadded + begin, w, s.logits.data() + size_t(i) * w);
    }
    shards.push_back(std::move(s));
    begin += w;
  }
  std::vector<float> max(kN, -INFINITY), sum(kN, 0.0f), target(kN, 0.0f);
  for (Shard& s : shards) {
    be.xent_row_max(s.row_max.data(), s.logits.data(), kN, s.width, s.begin, kVocab);
    for (int i = 0; i < kN; ++i) max[i] = std::max(max[i], s.row_max[i]);
  }
  for (Shard& s : shards) {
    be.xent_sum_exp(s.sum_exp.data(), s.target_logit.data(), s.logits.data(), max.data(),
                    targets.data(), kN, s.width, s.begin, kVocab);
    for (int i = 0; i < kN; ++i) {
      sum[i] += s.sum_exp[i];
      target[i] += s.target_logit[i];
    }
  }
  Xent out{std::vector<float>(kN), std::vector<float>(logits.size())};
  for (size_t k = 0; k < shards.size(); ++k) {
    Shard& s = shards[k];
    std::vector<float> losses(kN), separate(s.logits.size(), 9.0f);
    float* dl = in_place ? s.logits.data() : separate.data();
    be.xent_finish(losses.data(), dl, s.logits.data(), max.data(), sum.data(), target.data(),
                   targets.data(), kN, s.width, s.begin, kVocab, kScale);
    if (k == 0) out.losses = losses;
    EXPECT_EQ(losses, out.losses) << "TP ranks disagree on the losses";
    for (int i = 0; i < kN; ++i) {
      std::copy_n(dl + size_t(i) * s.width, s.width,
                  out.dlogits.data() + size_t(i) * kPadded + s.begin);
    }
  }
  return out;
}

class CrossEntropy : public ::testing::Test {
 protected:
  void SetUp() override {
    logits = random_floats(size_t(kN) * kPadded, 50, 3.0f);
    for (int i = 0; i < kN; ++i) {
      targets.push_back((i * 7) % kVocab);
      // Padding logits far above the rest: any that leaked into max or sum would dominate.
      for (int j = kVocab; j < kPadded; ++j) logits[size_t(i) * kPadded + j] = 80.0f;
    }
    targets[0] = kVocab - 1;  // the last real column
    want = reference(logits, targets);
  }
  std::vector<float> logits;
  std::vector<int32_t> targets;
  Xent want;
  std::unique_ptr<Backend> be = make_cpu_backend(2);
};

TEST_F(CrossEntropy, UnsplitMatchesReference) {
  Xent got = run_sharded(*be, logits, targets, {kPadded}, false);
  EXPECT_TRUE(all_close(got.losses, test::to_double(want.losses), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(got.dlogits, test::to_double(want.dlogits), 1e-6, 1e-5));
  for (int i = 0; i < kN; ++i) {
    for (int j = kVocab; j < kPadded; ++j) EXPECT_EQ(got.dlogits[size_t(i) * kPadded + j], 0.0f);
  }
}

TEST_F(CrossEntropy, SplitOverTwoRanksEqualsUnsplit) {
  Xent whole = run_sharded(*be, logits, targets, {kPadded}, false);
  Xent halves = run_sharded(*be, logits, targets, {kPadded / 2, kPadded / 2}, false);
  EXPECT_TRUE(all_close(halves.losses, test::to_double(whole.losses), 1e-5, 1e-6));
  EXPECT_TRUE(all_close(halves.dlogits, test::to_double(whole.dlogits), 1e-7, 1e-5));
  // A rank whose columns are all padding contributes nothing (its row_max is -inf).
  Xent uneven = run_sharded(*be, logits, targets, {kVocab, kPadded - kVocab}, false);
  EXPECT_TRUE(all_close(uneven.losses, test::to_double(whole.losses), 1e-5, 1e-6));
  EXPECT_TRUE(all_close(uneven.dlogits, test::to_double(whole.dlogits), 1e-7, 1e-5));
  std::vector<float> pad_max(kN);
  be->xent_row_max(pad_max.data(), logits.data() + kVocab, kN, kPadded - kVocab, kVocab, kVocab);
  for (float m : pad_max) EXPECT_EQ(m, -INFINITY);
}

TEST_F(CrossEntropy, DlogitsMayAliasLogits) {
  for (std::vector<int> widths : {std::vector<int>{kPadded}, std::vector<int>{24, 24}}) {
    Xent separate = run_sharded(*be, logits, targets, widths, false);
    Xent in_place = run_sharded(*be, logits, targets, widths, true);
    EXPECT_EQ(separate.losses, in_place.losses);
    EXPECT_EQ(separate.dlogits, in_place.dlogits);
  }
}

TEST_F(CrossEntropy, LossesOnlyWithoutDlogits) {
  std::vector<float> max(kN), sum(kN), target(kN), losses(kN);
  be->xent_row_max(max.data(), logits.data(), kN, kPadded, 0, kVocab);
  be->xent_sum_exp(sum.data(), target.data(), logits.data(), max.data(), targets.data(), kN,
                   kPadded, 0, kVocab);
  const auto before = logits;
  be->xent_finish(losses.data(), nullptr, logits.data(), max.data(), sum.data(), target.data(),
                  targets.data(), kN, kPadded, 0, kVocab, kScale);
  EXPECT_TRUE(all_close(losses, test::to_double(want.losses), 1e-5, 1e-5));
  EXPECT_EQ(logits, before);
}

TEST_F(CrossEntropy, RejectsTargetsOutsideTheVocabulary) {
  std::vector<float> max(kN), sum(kN), target(kN);
  be->xent_row_max(max.data(), logits.data(), kN, kPadded, 0, kVocab);
  targets[3] = kVocab;  // a padding column is never a target
  EXPECT_THROW(be->xent_sum_exp(sum.data(), target.data(), logits.data(), max.data(),
                                targets.data(), kN, kPadded, 0, kVocab),
               Error);
}

}  // namespace
}  // namespace keel
