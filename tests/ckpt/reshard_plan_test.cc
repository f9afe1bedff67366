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
#include "tests/test_expect.h"

namespace keel {
namespace {

constexpr int kLayers = 4;

keel_param_desc desc(const std::string& name, std::vector<int64_t> shape, int tp_dim = -1,
                     int blocks = 1) {
  keel_param_desc d{};
  std::strncpy(d.name, name.c_str(), KEEL_PARAM_NAME_MAX - 1);
  d.ndim = int32_t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  d.tp_dim = tp_dim;
  d.tp_blocks = blocks;
  return d;
}

// The toy model's table for one coordinate; `width` changes one tensor's shape.
std::vector<keel_param_desc> table(int pp, int p, int width = 8) {
  std::vector<keel_param_desc> t;
  const int per = kLayers / pp;
  if (p == 0) {
    t.push_back(desc("emb", {16, 8}, 0));
    if (pp > 1) std::strcpy(t.back().tied_to, "emb");
  }
  for (int l = p * per; l < (p + 1) * per; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    t.push_back(desc(h + "qkv", {24, width}, 0, 3));
    t.push_back(desc(h + "proj", {8, 8}, 1));
    t.push_back(desc(h + "bias", {5}));
  }
  if (p == pp - 1) {
    t.push_back(desc("norm", {8}));
    if (pp > 1) {
      t.push_back(desc("emb", {16, 8}, 0));
      t.back().flags = KEEL_PARAM_TIED_COPY;
      std::strcpy(t.back().tied_to, "emb");
    }
  }
  return t;
}

ShardedLayout layout(int tp, int pp, int dp, bool zero1, int width = 8) {
  ShardedLayout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.zero1 = zero1;
  for (int p = 0; p < pp; ++p)
    for (int t = 0; t < tp; ++t) l.tables.push_back(table(pp, p, width));
  return l;
}

// The value a global element of a tensor has in span `span`: the same in every layout.
float value(const std::string& name, size_t global, int span) {
  uint32_t h = 2166136261u;
  for (char c : name) h = (h ^ uint8_t(c)) * 16777619u;
  return float(h % 1000) + float(global) * 0.001f + float(span) * 1000.0f;
}

// What rank `rank` of `l` holds: every span, padding zero, moments its ZeRO-1 share.
std::vector<std::vector<float>> state_of(const ShardedLayout& l, int rank) {
  const RankStateShape s = rank_state_shape(l, rank);
  const Coord c = l.topology().coord(rank);
  std::vector<std::vector<float>> spans(3);
  for (int k = 0; k < 3; ++k) spans[size_t(k)].assign(s.span_floats(k), 0.0f);
  for (const ParamSlot& slot : s.params.slots) {
    const std::string name = slot.tied_copy() ? std::string(slot.desc.tied_to) : slot.name;
    for (const ShardRun& r : shard_runs(slot.desc, c.tp, l.tp))
      for (size_t i = 0; i < r.count; ++i) {
        const size_t flat = slot.offset + r.local + i;
        spans[0][flat] = value(name, r.global + i, 0);
        if (flat >= s.moment_begin && flat < s.moment_begin + s.moment_floats)
          for (int k = 1; k < 3; ++k)
            spans[size_t(k)][flat - s.moment_begin] = value(name, r.global + i, k);
      }
  }
  return spans;
}

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
