// Causal multi-head self-attention, llm.c-style (train_gpt2_fp32.cu): the two big products
// (QKᵀ and att·V, and their four backward products) are cuBLAS strided-batched GEMMs over the
// B·NH heads, and only the cheap glue is hand-written:
//   permute    qkv [B,T,3,NH,HS] → q, k, v [B,NH,T,HS]  (each head contiguous, for the GEMMs)
//   softmax    causal, one warp per row of att, in place over the scaled scores
//   unpermute  y [B,NH,T,HS] → out [B,T,NH,HS]
// This materialises att [B,NH,T,T], which the interface asks for anyway (it is saved for
// backward), and is far simpler than a fused flash kernel while keeping the FLOPs on cuBLAS.
//
// The 1/sqrt(HS) scale is the alpha of the QKᵀ GEMM, so the softmax needs no temperature.
// Rows of att and of the score gradient are written in full, zeros above the diagonal, because
// the following GEMMs read whole T×T matrices.
//
// Precision: in kBf16 mode the GEMM operands (q, k, v, att, the output gradient and the score
// gradient) are bf16 copies in backend scratch; GEMM outputs, att and all gradients stay fp32.
// Determinism: the softmax reductions are warp butterflies with a fixed order; the GEMMs are
// deterministic cuBLAS calls; each gradient element is written by one thread.
#include <cmath>

#include "runtime/cuda/common.cuh"
#include "runtime/cuda/kernels.h"

namespace keel::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = 8;

template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Element i of a [B, NH, T, HS] tensor lives at this offset of a [B, T, row_heads, HS]
// tensor (qkv rows hold 3·NH heads, q|k|v; dout rows hold NH).
__device__ inline size_t bhtd_to_bthd(size_t i, int Tn, int NH, int HS, int row_heads) {
  const int d = static_cast<int>(i % HS);
  const int t = static_cast<int>((i / HS) % Tn);
  const int h = static_cast<int>((i / (static_cast<size_t>(HS) * Tn)) % NH);
  const size_t b = i / (static_cast<size_t>(HS) * Tn * NH);
  return ((b * Tn + t) * row_heads + h) * HS + d;
}

// q[b,h,t,d] = qkv[b,t,0,h,d], k = block 1, v = block 2. Indexed in q's order so the writes
// are coalesced; the reads of one (b,t) row are contiguous HS-runs.
template <typename T>
__global__ void permute_kernel(T* __restrict__ q, T* __restrict__ k, T* __restrict__ v,
                               const float* __restrict__ qkv, int B, int Tn, int NH, int HS) {
  const size_t total = static_cast<size_t>(B) * NH * Tn * HS;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t src = bhtd_to_bthd(i, Tn, NH, HS, 3 * NH);
    const size_t block = static_cast<size_t>(NH) * HS;
    q[i] = from_float<T>(qkv[src]);
    k[i] = from_float<T>(qkv[src + block]);
    v[i] = from_float<T>(qkv[src + 2 * block]);
  }
}

// dqkv[b,t,0,h,d] += dq[b,h,t,d], and likewise for dk, dv (the interface accumulates).
__global__ void permute_backward_kernel(float* __restrict__ dqkv, const float* __restrict__ dq,
                                        const float* __restrict__ dk, const float* __restrict__ dv,
                                        int B, int Tn, int NH, int HS) {
  const size_t total = static_cast<size_t>(B) * NH * Tn * HS;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t dst = bhtd_to_bthd(i, Tn, NH, HS, 3 * NH);
    const size_t block = static_cast<size_t>(NH) * HS;
    dqkv[dst] += dq[i];
    dqkv[dst + block] += dk[i];
    dqkv[dst + 2 * block] += dv[i];
  }
}

// out[b,t,h,d] = y[b,h,t,d]; indexed in out's order so the writes are coalesced.
__global__ void unpermute_kernel(float* __restrict__ out, const float* __restrict__ y, int B,
                                 int Tn, int NH, int HS) {
  const size_t total = static_cast<size_t>(B) * NH * Tn * HS;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(i % HS);
    const int h = static_cast<int>((i / HS) % NH);
    const int t = static_cast<int>((i / (static_cast<size_t>(HS) * NH)) % Tn);
    const size_t b = i / (static_cast<size_t>(HS) * NH * Tn);
    out[i] = y[((b * NH + h) * Tn + t) * HS + d];
  }
}

// dy[b,h,t,d] = dout[b,t,h,d] (the backward of unpermute; dy is a fresh buffer).
template <typename T>
__global__ void unpermute_backward_kernel(T* __restrict__ dy, const float* __restrict__ dout, int B,
                                          int Tn, int NH, int HS) {
  const size_t total = static_cast<size_t>(B) * NH * Tn * HS;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dy[i] = from_float<T>(dout[bhtd_to_bthd(i, Tn, NH, HS, NH)]);
  }
}

// In place over att [rows = B·NH·T, T]: row r is query position t = r % T and keeps columns
// [0, t]. Each lane keeps an online (max, sum) over its columns, the warp combines them, and a
// second pass writes exp(x − max)/sum. A lane only ever reads and writes its own columns, so
// the in-place update is safe.
__global__ void softmax_causal_kernel(float* att, size_t rows, int Tn) {
  const size_t row = blockIdx.x * static_cast<size_t>(kWarpsPerBlock) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = static_cast<int>(row % Tn);
  float* x = att + row * Tn;

  float maxval = -INFINITY;
  float sumval = 0.0f;
  for (int i = lane; i <= t; i += kWarpSize) {
    const float v = x[i];
    const float new_max = fmaxf(maxval, v);
    sumval = sumval * expf(maxval - new_max) + expf(v - new_max);
    maxval = new_max;
  }
  const float row_max = warp_max(maxval);
  // Lanes with no columns have maxval = -inf and sumval = 0; guard the 0·exp(inf) case.
  sumval = sumval == 0.0f ? 0.0f : sumval * expf(maxval - row_max);
  const float inv_sum = 1.0f / warp_sum(sumval);

  for (int i = lane; i < Tn; i += kWarpSize) {
    x[i] = i <= t ? expf(x[i] - row_max) * inv_sum : 0.0f;
  }
}

// dscores = scale · att ⊙ (datt − Σ_j att_j·datt_j) on the causal part, 0 above it. datt is
// read from `datt` and the result written to `dscores`, which may be the same buffer (fp32
// mode) or a bf16 copy for the next GEMMs (bf16 mode); as above, lanes own their columns.
template <typename T>
__global__ void softmax_causal_backward_kernel(T* dscores, const float* datt,
                                               const float* __restrict__ att, size_t rows, int Tn,
                                               float scale) {
  const size_t row = blockIdx.x * static_cast<size_t>(kWarpsPerBlock) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = static_cast<int>(row % Tn);
  const float* a = att + row * Tn;
  const float* da = datt + row * Tn;
  T* out = dscores + row * Tn;

  float dot = 0.0f;
  for (int i = lane; i <= t; i += kWarpSize) dot += a[i] * da[i];
  dot = warp_sum(dot);

  for (int i = lane; i < Tn; i += kWarpSize) {
    const float g = i <= t ? scale * a[i] * (da[i] - dot) : 0.0f;
    out[i] = from_float<T>(g);
  }
}

template <typename T>
void launch_permute(Context& ctx, T* q, T* k, T* v, const float* qkv, int B, int Tn, int NH,
                    int HS) {
  const size_t total = static_cast<size_t>(B) * NH * Tn * HS;
  permute_kernel<T>
      <<<grid_for(total, kBlock), kBlock, 0, ctx.stream>>>(q, k, v, qkv, B, Tn, NH, HS);
  KEEL_CHECK_LAUNCH();
}

unsigned softmax_grid(size_t rows) {
  return static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock));
}

}  // namespace

void attention_forward(Context& ctx, float* out, float* att, const float* qkv, int B, int Tn,
                       int NH, int HS) {
  if (B <= 0 || Tn <= 0 || NH <= 0 || HS <= 0) return;
  const bool bf16 = ctx.precision == Precision::kBf16;
  const size_t btc = static_cast<size_t>(B) * Tn * NH * HS;
  const size_t rows = static_cast<size_t>(B) * NH * Tn;
  const long long sh = static_cast<long long>(Tn) * HS;  // stride between heads of q/k/v/y
  const long long sa = static_cast<long long>(Tn) * Tn;  // stride between heads of att
  const int heads = B * NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));

  float* y = ctx.scratch.get<float>(Slot::kAttention, bf16 ? btc : 4 * btc);
  const void *q, *k, *v;
  if (bf16) {
    auto* qkv16 = ctx.scratch.get<__nv_bfloat16>(Slot::kOperandA, 3 * btc);
    launch_permute(ctx, qkv16, qkv16 + btc, qkv16 + 2 * btc, qkv, B, Tn, NH, HS);
    q = qkv16, k = qkv16 + btc, v = qkv16 + 2 * btc;
  } else {
    float* qkv32 = y + btc;
    launch_permute(ctx, qkv32, qkv32 + btc, qkv32 + 2 * btc, qkv, B, Tn, NH, HS);
    q = qkv32, k = qkv32 + btc, v = qkv32 + 2 * btc;
  }

  // scores[t1, t2] = scale · q[t1]·k[t2]; column-major: scoresᵀ = kᵀ-view · q, per head.
  gemm_strided_batched(ctx, true, false, Tn, Tn, HS, scale, k, HS, sh, q, HS, sh, 0.0f, att, Tn, sa,
                       heads, bf16);
  softmax_causal_kernel<<<softmax_grid(rows), kWarpsPerBlock * kWarpSize, 0, ctx.stream>>>(
      att, rows, Tn);
  KEEL_CHECK_LAUNCH();

  const void* att_operand = att;
  if (bf16) {
    auto* att16 = ctx.scratch.get<__nv_bfloat16>(Slot::kOperandB, rows * Tn);
    to_bf16(ctx, att16, att, rows * Tn);
    att_operand = att16;
  }
  // y[t, d] = Σ_t2 att[t, t2]·v[t2, d]
  gemm_strided_batched(ctx, false, false, HS, Tn, Tn, 1.0f, v, HS, sh, att_operand, Tn, sa, 0.0f, y,
                       HS, sh, heads, bf16);
  unpermute_kernel<<<grid_for(btc, kBlock), kBlock, 0, ctx.stream>>>(out, y, B, Tn, NH, HS);
  KEEL_CHECK_LAUNCH();
}

void attention_backward(Context& ctx, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* att, int B, int Tn, int NH, int HS) {
  if (B <= 0 || Tn <= 0 || NH <= 0 || HS <= 0) return;
  const bool bf16 = ctx.precision == Precision::kBf16;
  const size_t btc = static_cast<size_t>(B) * Tn * NH * HS;
  const size_t rows = static_cast<size_t>(B) * NH * Tn;
  const long long sh = static_cast<long long>(Tn) * HS;
  const long long sa = static_cast<long long>(Tn) * Tn;
  const int heads = B * NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));

  // fp32 layout of kAttention: dq | dk | dv | q | k | v | dy; bf16 mode keeps only dq|dk|dv
  // there and the GEMM operands in the bf16 operand slots.
  float* grads = ctx.scratch.get<float>(Slot::kAttention, bf16 ? 3 * btc : 7 * btc);
  float *dq = grads, *dk = grads + btc, *dv = grads + 2 * btc;
  float* datt = scratch;  // [B,NH,T,T], becomes the score gradient in fp32 mode
  const void *q, *k, *v, *dy, *att_operand, *dscores;
  if (bf16) {
    auto* qkv16 = ctx.scratch.get<__nv_bfloat16>(Slot::kOperandA, 3 * btc);
    launch_permute(ctx, qkv16, qkv16 + btc, qkv16 + 2 * btc, qkv, B, Tn, NH, HS);
    auto* att16 = ctx.scratch.get<__nv_bfloat16>(Slot::kOperandB, rows * Tn);
    to_bf16(ctx, att16, att, rows * Tn);
    auto* dy16 = ctx.scratch.get<__nv_bfloat16>(Slot::kOperandC, btc);
    unpermute_backward_kernel<__nv_bfloat16>
        <<<grid_for(btc, kBlock), kBlock, 0, ctx.stream>>>(dy16, dout, B, Tn, NH, HS);
    KEEL_CHECK_LAUNCH();
    q = qkv16, k = qkv16 + btc, v = qkv16 + 2 * btc, att_operand = att16, dy = dy16;
  } else {
    float* qkv32 = grads + 3 * btc;
    launch_permute(ctx, qkv32, qkv32 + btc, qkv32 + 2 * btc, qkv, B, Tn, NH, HS);
    float* dy32 = grads + 6 * btc;
    unpermute_backward_kernel<float>
        <<<grid_for(btc, kBlock), kBlock, 0, ctx.stream>>>(dy32, dout, B, Tn, NH, HS);
    KEEL_CHECK_LAUNCH();
    q = qkv32, k = qkv32 + btc, v = qkv32 + 2 * btc, att_operand = att, dy = dy32;
  }

  // datt[t, t2] = dy[t]·v[t2]
  gemm_strided_batched(ctx, true, false, Tn, Tn, HS, 1.0f, v, HS, sh, dy, HS, sh, 0.0f, datt, Tn,
                       sa, heads, bf16);
  // dv[t2, d] = Σ_t att[t, t2]·dy[t, d]
  gemm_strided_batched(ctx, false, true, HS, Tn, Tn, 1.0f, dy, HS, sh, att_operand, Tn, sa, 0.0f,
                       dv, HS, sh, heads, bf16);
  if (bf16) {
    auto* ds16 = ctx.scratch.get<__nv_bfloat16>(Slot::kOperandD, rows * Tn);
    softmax_causal_backward_kernel<__nv_bfloat16>
        <<<softmax_grid(rows), kWarpsPerBlock * kWarpSize, 0, ctx.stream>>>(ds16, datt, att, rows,
                                                                            Tn, scale);
    dscores = ds16;
  } else {
    softmax_causal_backward_kernel<float>
        <<<softmax_grid(rows), kWarpsPerBlock * kWarpSize, 0, ctx.stream>>>(datt, datt, att, rows,
                                                                            Tn, scale);
    dscores = datt;
  }
  KEEL_CHECK_LAUNCH();
  // dq[t, d] = Σ_t2 dscores[t, t2]·k[t2, d];  dk[t2, d] = Σ_t dscores[t, t2]·q[t, d]
  gemm_strided_batched(ctx, false, false, HS, Tn, Tn, 1.0f, k, HS, sh, dscores, Tn, sa, 0.0f, dq,
                       HS, sh, heads, bf16);
  gemm_strided_batched(ctx, false, true, HS, Tn, Tn, 1.0f, q, HS, sh, dscores, Tn, sa, 0.0f, dk, HS,
                       sh, heads, bf16);
  permute_backward_kernel<<<grid_for(btc, kBlock), kBlock, 0, ctx.stream>>>(dqkv, dq, dk, dv, B, Tn,
                                                                            NH, HS);
  KEEL_CHECK_LAUNCH();
}

}  // namespace keel::cuda
