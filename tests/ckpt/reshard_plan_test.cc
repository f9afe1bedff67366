// The resharding planner as pure code: a toy plugin's tables (a vocab-parallel embedding tied
// to a copy on the last stage, a fused q|k|v in three TP blocks, a row-parallel projection,
// a replicated bias, layers over stages), every state float given a value that says which
// tensor, element and span it is. A plan from one layout carried out in memory must give
// every rank of another exactly the state that layout holds, for TP, PP, DP and ZeRO-1 in
// both directions; a table that lacks a tensor or shapes it otherwise is refused by name.
#include "ckpt/reshard_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "model/train_state.h"
#include "tests/ckpt/reshard_toy.h"
#include "tests/test_expect.h"

namespace keel {
namespace {

using namespace test::toy;

// Carries out the plan for every rank of `to` against `from`'s states in memory.
void expect_resharded(const ShardedLayout& from, const ShardedLayout& to) {
  std::vector<std::vector<std::vector<float>>> files;
  for (int r = 0; r < from.world(); ++r) files.push_back(state_of(from, r));
  for (int r = 0; r < to.world(); ++r) {
    const RankStateShape s = rank_state_shape(to, r);
    std::vector<std::vector<float>> got(3);
    for (int k = 0; k < 3; ++k) got[size_t(k)].assign(s.span_floats(k), 0.0f);
    for (const CopyRun& run : plan_reshard(from, to, r)) {
      const std::vector<float>& src = files[size_t(run.src_rank)][size_t(run.span)];
      std::vector<float>& dst = got[size_t(run.span)];
      ASSERT_LE(run.src_offset + run.floats, src.size());
      ASSERT_LE(run.dst_offset + run.floats, dst.size());
      std::copy_n(src.begin() + long(run.src_offset), run.floats,
                  dst.begin() + long(run.dst_offset));
    }
    const auto want = state_of(to, r);
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(got[size_t(k)], want[size_t(k)]) << "rank " << r << " span " << k;
  }
}

// Replicas hold equal parameters (and, without ZeRO-1, equal moments): the first one's file
// is read, and a tensor's runs are one where both sides keep it in one piece.
TEST(ReshardPlan, ReadsTheFirstReplicaInWholeTensors) {
  const ShardedLayout l = layout(2, 2, 2, false);
  const auto runs = plan_reshard(l, l, 3);  // dp 1, pp 0, tp 1
  EXPECT_LE(runs.size(), 3u * 7);           // at most one per tensor (emb, 2 layers of 3) and span
  for (const CopyRun& r : runs) EXPECT_EQ(r.src_rank, 1);
  expect_resharded(l, l);
}

TEST(ReshardPlan, FromThreeDimensionsToEveryOtherLayout) {
  for (bool z : {false, true}) {
    const ShardedLayout from = layout(2, 2, 2, z);
    for (auto [tp, pp, dp] : {std::tuple{1, 1, 1}, {1, 2, 4}, {2, 1, 2}, {4, 1, 1}, {4, 4, 1}})
      for (bool z_to : {false, true}) {
        SCOPED_TRACE(testing::Message() << "zero1 " << z << " -> (" << tp << "," << pp << "," << dp
                                        << ") zero1 " << z_to);
        expect_resharded(from, layout(tp, pp, dp, z_to));
      }
  }
}

TEST(ReshardPlan, IntoThreeDimensionsWithZeroOneFromOneRank) {
  expect_resharded(layout(1, 1, 1, false), layout(2, 2, 2, true));
  expect_resharded(layout(1, 4, 2, true), layout(4, 1, 2, true));
}

TEST(ReshardPlan, ShapesOfTheLayoutThatWroteIt) {
  const ShardedLayout l = layout(2, 2, 2, true);
  const RankStateShape s = rank_state_shape(l, 7);  // dp 1, pp 1, tp 1
  EXPECT_EQ(s.moment_floats * 2, s.params.padded);
  EXPECT_EQ(s.moment_begin, s.moment_floats);
  EXPECT_EQ(s.fingerprint, layout_fingerprint(s.params.slots, s.params.padded, s.moment_floats));
  EXPECT_NE(s.fingerprint, rank_state_shape(layout(2, 2, 2, false), 7).fingerprint);
}

TEST(ReshardPlan, RefusesAnotherModelNamingTheTensor) {
  EXPECT_HAS(test::input_error_of(
                 [] { plan_reshard(layout(2, 2, 2, false), layout(1, 1, 1, false, 16), 0); }),
             "parameter 'h.0.qkv': shape [24, 8] in the checkpoint, [24, 16] in this job");
  ShardedLayout fewer = layout(1, 1, 1, false);
  fewer.tables[0].pop_back();  // no "norm"
  EXPECT_HAS(test::input_error_of([&] { plan_reshard(fewer, layout(2, 1, 1, false), 1); }),
             "parameter 'norm': not in the checkpoint");
}

}  // namespace
}  // namespace keel
