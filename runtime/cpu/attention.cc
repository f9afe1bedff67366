// Causal self-attention, one (batch, head) at a time as three GEMMs around a softmax, the
// way llm.c's attention_forward computes it but with OpenBLAS doing the T×T×HS products:
// at T = 256 the scalar triple loops would cost as much as the rest of the layer.
// The (b, h) pairs are split statically over the OpenMP threads, each calling a
// single-threaded sgemm; every output element belongs to exactly one (b, h), so nothing is
// reduced across threads.
//
// qkv is [B, T, 3·C] with C = NH·HS: for token (b, t), q is columns [0, C), k [C, 2C), v
// [2C, 3C), head h at offset h·HS in each. att is [B, NH, T, T], row t holding the softmax over
// keys 0..t and zeros above the diagonal (so att·V may be a plain GEMM).
#include <cmath>
#include <cstring>

#include "runtime/cpu/kernels.h"

namespace keel::cpu {

namespace {

// Rows of T keys, in place: softmax over columns 0..t of row t, zeros after.
void causal_softmax_rows(float* att, int T) {
  for (int t = 0; t < T; ++t) {
    float* row = att + static_cast<size_t>(t) * T;
    const float maxval = lane_max(row, t + 1);
    for (int j = 0; j <= t; ++j) row[j] = exp_approx(row[j] - maxval);
    const float inv = 1.0f / lane_sum(row, t + 1);
    for (int j = 0; j <= t; ++j) row[j] *= inv;
    std::memset(row + t + 1, 0, sizeof(float) * static_cast<size_t>(T - t - 1));
  }
}

// In place: datt becomes dpreatt = scale · att ⊙ (datt − Σ_j att·datt), the softmax backward,
// with zeros above the diagonal.
void causal_softmax_backward_rows(float* datt, const float* att, int T, float scale) {
  for (int t = 0; t < T; ++t) {
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
    // preatt = scale · Q·Kᵀ. The upper triangle is computed and then discarded: splitting the
    // GEMM into causal blocks would save flops but the smaller GEMMs run slower per flop.
    gemm_serial(false, true, T, T, HS, scale, q, C3, k, C3, 0.0f, a, T);
    causal_softmax_rows(a, T);
    // out[b, :, h, :] = att · V
    gemm_serial(false, false, T, HS, T, 1.0f, a, T, v, C3, 0.0f,
                out + static_cast<size_t>(b) * T * C + h * HS, C);
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
    // datt = dout·Vᵀ; dV += attᵀ·dout
    gemm_serial(false, true, T, T, HS, 1.0f, d, C, v, C3, 0.0f, datt, T);
    gemm_serial(true, false, T, HS, T, 1.0f, a, T, d, C, 1.0f, dv, C3);
    // dpreatt, with the 1/sqrt(HS) of the forward folded in.
    causal_softmax_backward_rows(datt, a, T, scale);
    // dQ += dpreatt·K; dK += dpreattᵀ·Q
    gemm_serial(false, false, T, HS, T, 1.0f, datt, T, k, C3, 1.0f, dq, C3);
    gemm_serial(true, false, T, HS, T, 1.0f, datt, T, q, C3, 1.0f, dk, C3);
  }
}

}  // namespace keel::cpu
