// Causal self-attention, one (batch, head) at a time as GEMMs around a softmax, the way
// llm.c's attention_forward computes it but with OpenBLAS doing the T×T×HS products: at
// T = 256 the scalar triple loops would cost as much as the rest of the layer.
// The (b, h) pairs are split statically over the OpenMP threads, each calling a
// single-threaded sgemm; every output element belongs to exactly one (b, h), so nothing is
// reduced across threads.
//
// Causality is used at the granularity of kRowBlock-row blocks: query block r only ever
// sees keys [0, end of block r), so each GEMM covers the blocks on and below the diagonal
// and skips the rest (about 5/8 of the square's flops at T = 256). The skipped products
// are zeros of att, so dropping them changes no result.
//
// qkv is [B, T, 3·C] with C = NH·HS: for token (b, t), q is columns [0, C), k [C, 2C), v
// [2C, 3C), head h at offset h·HS in each. att is [B, NH, T, T], row t holding the softmax over
// keys 0..t and zeros above the diagonal.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/cpu/kernels.h"

namespace keel::cpu {

namespace {

// Rows of a causal block. 64 rows measured fastest on the medium GPT (T = 256, HS = 64):
// smaller blocks skip more of the upper triangle but their GEMMs run slower per flop.
constexpr int kRowBlock = 64;

// Rows [t0, t1) of T keys, in place: softmax over columns 0..t of row t, zeros after.
KEEL_WIDE_CLONES void causal_softmax_rows(float* att, int T, int t0, int t1) {
  for (int t = t0; t < t1; ++t) {
    float* row = att + static_cast<size_t>(t) * T;
    const float maxval = lane_max(row, t + 1);
    for (int j = 0; j <= t; ++j) row[j] = exp_approx(row[j] - maxval);
    const float inv = 1.0f / lane_sum(row, t + 1);
    for (int j = 0; j <= t; ++j) row[j] *= inv;
    std::memset(row + t + 1, 0, sizeof(float) * static_cast<size_t>(T - t - 1));
  }
}

// Rows [t0, t1), in place: datt becomes dpreatt = scale · att ⊙ (datt − Σ_j att·datt), the
// softmax backward, with zeros above the diagonal.
KEEL_WIDE_CLONES void causal_softmax_backward_rows(float* datt, const float* att, int T, int t0,
                                                   int t1, float scale) {
  for (int t = t0; t < t1; ++t) {
    float* d = datt + static_cast<size_t>(t) * T;
    const float* a = att + static_cast<size_t>(t) * T;
    const float dot = lane_dot(a, d, t + 1);
    for (int j = 0; j <= t; ++j) d[j] = scale * a[j] * (d[j] - dot);
    std::memset(d + t + 1, 0, sizeof(float) * static_cast<size_t>(T - t - 1));
  }
}

}  // namespace

void attention_forward(int nt, float* out, float* att, const float* qkv, int B, int T, int NH,
                       int HS) {
  blas_single_threaded();
  const int C = NH * HS, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const float* q = qkv + static_cast<size_t>(b) * T * C3 + h * HS;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att + static_cast<size_t>(bh) * T * T;
    float* o = out + static_cast<size_t>(b) * T * C + h * HS;
    for (int r0 = 0; r0 < T; r0 += kRowBlock) {
      const int r1 = std::min(T, r0 + kRowBlock), rows = r1 - r0;
      float* ar = a + static_cast<size_t>(r0) * T;
      // preatt = scale · Q·Kᵀ over keys [0, r1); the softmax zeroes the rest of the rows.
      gemm_serial(false, true, rows, r1, HS, scale, q + static_cast<size_t>(r0) * C3, C3, k, C3,
                  0.0f, ar, T);
      causal_softmax_rows(a, T, r0, r1);
      // out[b, r0:r1, h, :] = att · V
      gemm_serial(false, false, rows, HS, r1, 1.0f, ar, T, v, C3, 0.0f,
                  o + static_cast<size_t>(r0) * C, C);
    }
  }
}

void attention_backward(int nt, float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int NH, int HS) {
  blas_single_threaded();
  const int C = NH * HS, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const size_t base = static_cast<size_t>(b) * T * C3 + h * HS;
    const float* q = qkv + base;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + base;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* a = att + static_cast<size_t>(bh) * T * T;
    const float* d = dout + static_cast<size_t>(b) * T * C + h * HS;
    float* datt = scratch + static_cast<size_t>(bh) * T * T;
    // By query block: datt = dout·Vᵀ, then dpreatt (with the forward's 1/sqrt(HS) folded in),
    // then dQ += dpreatt·K.
    for (int r0 = 0; r0 < T; r0 += kRowBlock) {
      const int r1 = std::min(T, r0 + kRowBlock), rows = r1 - r0;
      float* dr = datt + static_cast<size_t>(r0) * T;
      gemm_serial(false, true, rows, r1, HS, 1.0f, d + static_cast<size_t>(r0) * C, C, v, C3, 0.0f,
                  dr, T);
      causal_softmax_backward_rows(datt, a, T, r0, r1, scale);
      gemm_serial(false, false, rows, HS, r1, 1.0f, dr, T, k, C3, 1.0f,
                  dq + static_cast<size_t>(r0) * C3, C3);
    }
    // By key block [c0, c1), which only queries [c0, T) see: dV += attᵀ·dout and
    // dK += dpreattᵀ·Q.
    for (int c0 = 0; c0 < T; c0 += kRowBlock) {
      const int c1 = std::min(T, c0 + kRowBlock), cols = c1 - c0;
      const size_t corner = static_cast<size_t>(c0) * T + c0;
      gemm_serial(true, false, cols, HS, T - c0, 1.0f, a + corner, T,
                  d + static_cast<size_t>(c0) * C, C, 1.0f, dv + static_cast<size_t>(c0) * C3, C3);
      gemm_serial(true, false, cols, HS, T - c0, 1.0f, datt + corner, T,
                  q + static_cast<size_t>(c0) * C3, C3, 1.0f, dk + static_cast<size_t>(c0) * C3,
                  C3);
    }
  }
}

}  // namespace keel::cpu
