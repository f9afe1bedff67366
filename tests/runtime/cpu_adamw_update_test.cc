// The out-of-place AdamW step (Backend::adamw_update) gives the bits of the in-place one,
// copies the padding between segments, leaves its inputs alone, and hashes every block it
// wrote exactly as block_digest does; also for a ZeRO-1 shard that starts mid-buffer.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "runtime/backend.h"
#include "runtime/block_digest.h"

namespace keel {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Case {
  size_t params;  // flat buffer (a whole number of blocks)
  size_t begin, end;
  std::vector<AdamWSegment> segments;
};

void check(Backend& b, const Case& c) {
  const size_t P = c.params, M = c.end - c.begin;
  auto p = random_floats(P, 1, -1, 1), g = random_floats(P, 2, -0.1f, 0.1f);
  auto m = random_floats(M, 3, -0.01f, 0.01f), v = random_floats(M, 4, 0, 0.001f);
  AdamWParams ap;
  ap.lr = 3e-3f;
  ap.grad_scale = 0.7f;
  ap.t = 5;

  // In place, segment by segment, as the Trainer does without snapshot banks.
  auto p_ref = p, m_ref = m, v_ref = v;
  for (const AdamWSegment& s : c.segments) {
    AdamWParams sp = ap;
    sp.weight_decay = s.weight_decay;
    b.adamw(p_ref.data() + s.begin, g.data() + s.begin, m_ref.data() + (s.begin - c.begin),
            v_ref.data() + (s.begin - c.begin), s.end - s.begin, sp);
  }

  std::vector<float> p_out(P, 42.0f), m_out(M, 42.0f), v_out(M, 42.0f);
  const size_t pb = digest_block_count(P * sizeof(float)), mb = digest_block_count(M * 4);
  std::vector<uint64_t> hp(pb, 0), hm(mb), hv(mb);
  const auto p_in = p, m_in = m, v_in = v;
  AdamWUpdate u;
  u.param = p.data();
  u.grad = g.data();
  u.m = m.data();
  u.v = v.data();
  u.param_out = p_out.data();
  u.m_out = m_out.data();
  u.v_out = v_out.data();
  u.begin = c.begin;
  u.end = c.end;
  u.segments = c.segments.data();
  u.num_segments = c.segments.size();
  u.param_hashes = hp.data();
  u.m_hashes = hm.data();
  u.v_hashes = hv.data();
  b.adamw_update(u, ap);

  EXPECT_EQ(p, p_in);  // inputs untouched
  EXPECT_EQ(m, m_in);
  EXPECT_EQ(v, v_in);
  EXPECT_EQ(0, std::memcmp(p_out.data() + c.begin, p_ref.data() + c.begin, M * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(m_out.data(), m_ref.data(), M * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v_out.data(), v_ref.data(), M * sizeof(float)));
  for (size_t i = c.begin / kDigestBlockFloats; i < c.end / kDigestBlockFloats; ++i)
    EXPECT_EQ(hp[i], hash_block(p_out.data() + i * kDigestBlockFloats, kDigestBlockBytes)) << i;
  for (size_t i = 0; i < mb; ++i) {
    EXPECT_EQ(hm[i], hash_block(m_out.data() + i * kDigestBlockFloats, kDigestBlockBytes)) << i;
    EXPECT_EQ(hv[i], hash_block(v_out.data() + i * kDigestBlockFloats, kDigestBlockBytes)) << i;
  }

  // hash_blocks agrees, and the combined hashes are block_digest of the buffer.
  std::vector<uint64_t> all(pb);
  b.hash_blocks(p_out.data(), P, all.data());
  EXPECT_EQ(combine_block_hashes(all.data(), all.size()),
            block_digest(p_out.data(), P * sizeof(float)));
}

TEST(CpuAdamWUpdate, OutOfPlaceEqualsInPlaceAndHashesWhatItWrote) {
  for (int threads : {1, 2, 3}) {
    auto b = make_cpu_backend(threads);
    ASSERT_TRUE(b->updates_out_of_place());
    const size_t B = kDigestBlockFloats;
    // Segments with gaps (alignment padding), one across a block boundary, a tail of padding.
    check(*b, {4 * B, 0, 4 * B, {{0, 100, 0.1f}, {112, B + 7, 0.0f}, {B + 16, 3 * B + 5, 0.1f}}});
    // A ZeRO-1 shard: blocks 2 and 3 of 4, moments indexed from the shard's start.
    check(*b, {4 * B, 2 * B, 4 * B, {{2 * B, 2 * B + 50, 0.1f}, {2 * B + 64, 4 * B - 16, 0.0f}}});
  }
}

}  // namespace
}  // namespace keel
