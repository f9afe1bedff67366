// Sharding rules of the runtime: a TP shard is exactly the slice model/plugin.h describes,
// and sharded initialisation reproduces the single-rank weights.
#include "model/param_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "runtime/check.h"

namespace keel {
namespace {

keel_param_desc desc(const char* name, std::vector<int64_t> shape, int tp_dim, int blocks,
                     int init = KEEL_INIT_NORMAL) {
  keel_param_desc d{};
  std::strncpy(d.name, name, KEEL_PARAM_NAME_MAX - 1);
  d.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  d.tp_dim = tp_dim;
  d.tp_blocks = blocks;
  d.init = init;
  d.init_std = 0.02f;
  return d;
}

TEST(ParamShard, FusedQkvBlocksSplitPerBlock) {
  // [3C, C] with C = 4 over tp = 2: rank 1 holds rows 2-3 of q, k and v blocks.
  keel_param_desc d = desc("qkv", {12, 4}, 0, 3);
  std::vector<float> full(48);
  std::iota(full.begin(), full.end(), 0.0f);
  std::vector<float> local(24);
  shard_from_full(d, 1, 2, full.data(), local.data());
  std::vector<float> want;
  for (int row : {2, 3, 6, 7, 10, 11})
    for (int c = 0; c < 4; ++c) want.push_back(float(row * 4 + c));
  EXPECT_EQ(local, want);
}

TEST(ParamShard, RowParallelSplitsColumns) {
  keel_param_desc d = desc("proj", {2, 6}, 1, 1);
  std::vector<float> full(12);
  std::iota(full.begin(), full.end(), 0.0f);
  std::vector<float> local(4);
  shard_from_full(d, 2, 3, full.data(), local.data());
  EXPECT_EQ(local, (std::vector<float>{4, 5, 10, 11}));
}

TEST(ParamShard, RoundTripOverAllRanks) {
  for (auto d : {desc("a", {6, 4, 2}, 1, 1), desc("b", {12, 3}, 0, 3), desc("c", {5}, -1, 1)}) {
    const int tp = d.tp_dim >= 0 ? 2 : 1;
    std::vector<float> full(global_numel(d));
    std::iota(full.begin(), full.end(), 1.0f);
    std::vector<float> back(full.size(), 0.0f);
    for (int r = 0; r < tp; ++r) {
      std::vector<float> local(full.size() / tp);
      shard_from_full(d, r, tp, full.data(), local.data());
      full_from_shard(d, r, tp, local.data(), back.data());
    }
    EXPECT_EQ(back, full) << d.name;
  }
}

TEST(ParamStore, ShardedInitEqualsSingleRankInit) {
  auto backend = make_cpu_backend(1);
  std::vector<keel_param_desc> descs = {desc("w", {12, 8}, 0, 3), desc("p", {8, 6}, 1, 1),
                                        desc("ln", {8}, -1, 1, KEEL_INIT_ONES)};
  ParamStore whole(backend.get(), descs, 0, 1, 1);
  whole.init(42);
  auto ref = whole.local_to_host();
  std::vector<std::vector<float>> rebuilt(descs.size());
  for (size_t i = 0; i < descs.size(); ++i) rebuilt[i].assign(global_numel(descs[i]), 0.0f);
  for (int r = 0; r < 2; ++r) {
    ParamStore shard(backend.get(), descs, r, 2, 2);
    shard.init(42);
    auto local = shard.local_to_host();
    for (size_t i = 0; i < descs.size(); ++i)
      full_from_shard(descs[i], r, 2, local[i].data(), rebuilt[i].data());
  }
  EXPECT_EQ(rebuilt, ref);
  EXPECT_NE(ref[0][0], ref[0][1]);
  ParamStore other(backend.get(), descs, 0, 1, 1);
  other.init(43);
  EXPECT_NE(other.local_to_host()[0], ref[0]);
}

TEST(ParamStore, PaddedForDataParallelShards) {
  auto backend = make_cpu_backend(1);
  ParamStore s(backend.get(), {desc("x", {7}, -1, 1), desc("y", {5}, -1, 1)}, 0, 1, 3);
  EXPECT_EQ(s.padded_numel() % 3, 0u);
  EXPECT_EQ(s.slots()[1].offset % 16, 0u);
  EXPECT_EQ(s.local_count(), 12);
}

TEST(ParamStore, LoadFullNamesMissingTensor) {
  auto backend = make_cpu_backend(1);
  ParamStore s(backend.get(), {desc("x", {4}, -1, 1)}, 0, 1, 1);
  try {
    s.load_full({{"y", std::vector<float>(4)}}, "ckpt.bin");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt.bin: has no tensor for parameter 'x'"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace keel
