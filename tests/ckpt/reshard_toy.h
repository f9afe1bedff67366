// A toy plugin's parameter tables for the resharding tests (tests/ckpt/reshard_plan_test.cc,
// memory_reshard_test.cc): a vocab-parallel embedding tied to a copy on the last stage, a
// fused q|k|v in three TP blocks, a row-parallel projection, a replicated bias, layers over
// stages; and every state float a value that says which tensor, element and span it is.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "ckpt/reshard_plan.h"
#include "model/train_state.h"

namespace keel::test::toy {

constexpr int kLayers = 4;

inline keel_param_desc desc(const std::string& name, std::vector<int64_t> shape, int tp_dim = -1,
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
inline std::vector<keel_param_desc> table(int pp, int p, int width = 8) {
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

inline ShardedLayout layout(int tp, int pp, int dp, bool zero1, int width = 8) {
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
inline float value(const std::string& name, size_t global, int span) {
  uint32_t h = 2166136261u;
  for (char c : name) h = (h ^ uint8_t(c)) * 16777619u;
  return float(h % 1000) + float(global) * 0.001f + float(span) * 1000.0f;
}

// What rank `rank` of `l` holds: every span, padding zero, moments its ZeRO-1 share.
inline std::vector<std::vector<float>> state_of(const ShardedLayout& l, int rank) {
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

}  // namespace keel::test::toy
