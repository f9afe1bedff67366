// The out-of-place AdamW step with its block hashes (Backend::adamw_update), and block
// hashing on the backend's threads. Work is split into 64 KiB digest blocks dealt out in a
// static schedule; each block is updated and then hashed while it is still in cache.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "runtime/block_digest.h"
#include "runtime/check.h"
#include "runtime/cpu/kernels.h"

namespace keel::cpu {

void adamw_update(int nt, const AdamWUpdate& u, const AdamWParams& p) {
  KEEL_CHECK(p.t >= 1, "AdamW step t must be >= 1, got ", p.t);
  KEEL_CHECK(u.begin % kDigestBlockFloats == 0 && u.begin <= u.end, "out-of-place AdamW range [",
             u.begin, ", ", u.end, ") is not block-aligned");
  const AdamWConstants c(p);
  const AdamWSegment* seg_begin = u.segments;
  const AdamWSegment* seg_end = u.segments + u.num_segments;
  const size_t blocks = (u.end - u.begin + kDigestBlockFloats - 1) / kDigestBlockFloats;
  const size_t first_block = u.begin / kDigestBlockFloats;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = u.begin + b * kDigestBlockFloats;
    const size_t hi = std::min(u.end, lo + kDigestBlockFloats);
    // The first segment that ends after lo; gaps between segments are padding, copied.
    const AdamWSegment* s = std::upper_bound(
        seg_begin, seg_end, lo, [](size_t x, const AdamWSegment& g) { return x < g.end; });
    size_t i = lo;
    auto copy_to = [&](size_t stop) {
      if (stop <= i) return;
      const size_t n = stop - i;
      std::memcpy(u.param_out + i, u.param + i, n * sizeof(float));
      std::memcpy(u.m_out + (i - u.begin), u.m + (i - u.begin), n * sizeof(float));
      std::memcpy(u.v_out + (i - u.begin), u.v + (i - u.begin), n * sizeof(float));
      i = stop;
    };
    for (; i < hi && s != seg_end; ++s) {
      copy_to(std::min(hi, s->begin));
      const size_t stop = std::min(hi, s->end);
      if (stop > i) {
        const size_t k = i - u.begin;  // moments are indexed from begin
        adamw_span(c, s->weight_decay, u.param + i, u.grad + i, u.m + k, u.v + k, u.param_out + i,
                   u.m_out + k, u.v_out + k, stop - i);
        i = stop;
      }
    }
    copy_to(hi);
    const size_t bytes = (hi - lo) * sizeof(float);
    u.param_hashes[first_block + b] = hash_block(u.param_out + lo, bytes);
    u.m_hashes[b] = hash_block(u.m_out + (lo - u.begin), bytes);
    u.v_hashes[b] = hash_block(u.v_out + (lo - u.begin), bytes);
  }
}

void hash_blocks(int nt, const float* x, size_t n, uint64_t* out) {
  const size_t blocks = (n + kDigestBlockFloats - 1) / kDigestBlockFloats;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * kDigestBlockFloats;
    out[b] = hash_block(x + lo, (std::min(n, lo + kDigestBlockFloats) - lo) * sizeof(float));
  }
}

}  // namespace keel::cpu
