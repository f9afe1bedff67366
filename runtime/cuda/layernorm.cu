// LayerNorm over the last dimension (eps 1e-5, as GPT-2), llm.c-style.
//
// Forward: one warp per row. Rows are short (C floats) and independent, so a warp strides
// through its row with coalesced loads, and the mean and variance come out of a butterfly
// shuffle reduction with a fixed pairing order (deterministic, no shared memory).
//
// Backward has two different reductions and we keep them apart:
// - per row (for dinp): the means of w·dout and w·dout·norm, again one warp per row;
// - per column (dweight = Σ dout·norm, dbias = Σ dout over all rows): llm.c folds these into
//   the row kernel with shared-memory and global atomics, which makes the bits depend on
//   timing. Here they go through column_sums_accumulate (common.cuh): fixed chunks of rows,
//   partial sums, then an ordered sum of the partials. One extra read of dout and inp buys
//   bitwise reproducibility.
#include "runtime/cuda/common.cuh"
#include "runtime/cuda/kernels.h"

namespace keel::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kWarpsPerBlock = 8;

__global__ void layernorm_forward_kernel(float* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, const float* __restrict__ inp,
                                         const float* __restrict__ weight,
                                         const float* __restrict__ bias, int N, int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // whole warps exit together, so the shuffles below stay full-warp
  const float* x = inp + static_cast<size_t>(row) * C;

  float sum = 0.0f;
  for (int i = lane; i < C; i += kWarpSize) sum += x[i];
  const float m = warp_sum(sum) / C;

  float var = 0.0f;
  for (int i = lane; i < C; i += kWarpSize) {
    float d = x[i] - m;
    var += d * d;
  }
  const float s = rsqrtf(warp_sum(var) / C + kEps);

  float* o = out + static_cast<size_t>(row) * C;
  for (int i = lane; i < C; i += kWarpSize) {
    float n = s * (x[i] - m);
    o[i] = n * weight[i] + (bias != nullptr ? bias[i] : 0.0f);
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = m;
    if (rstd != nullptr) rstd[row] = s;
  }
}

// dinp += rstd · (dnorm − mean(dnorm) − norm · mean(dnorm · norm)), dnorm = weight · dout.
__global__ void layernorm_backward_dinp_kernel(float* __restrict__ dinp,
                                               const float* __restrict__ dout,
                                               const float* __restrict__ inp,
                                               const float* __restrict__ weight,
                                               const float* __restrict__ mean,
                                               const float* __restrict__ rstd, int N, int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const size_t base = static_cast<size_t>(row) * C;
  const float m = mean[row];
  const float s = rstd[row];

  float dnorm_mean = 0.0f;
  float dnorm_norm_mean = 0.0f;
  for (int i = lane; i < C; i += kWarpSize) {
    float norm = (inp[base + i] - m) * s;
    float dnorm = weight[i] * dout[base + i];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
  }
  dnorm_mean = warp_sum(dnorm_mean) / C;
  dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;

  for (int i = lane; i < C; i += kWarpSize) {
    float norm = (inp[base + i] - m) * s;
    float dnorm = weight[i] * dout[base + i];
    dinp[base + i] += s * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
  }
}

// Column values for the parameter gradients: {dout·norm (→ dweight), dout (→ dbias)}.
struct LayerNormParamGrads {
  const float* dout;
  const float* inp;
  const float* mean;
  const float* rstd;
  int C;
  __device__ ColumnValues<2> operator()(int row, int col) const {
    const size_t i = static_cast<size_t>(row) * C + col;
    const float d = dout[i];
    return {{d * (inp[i] - mean[row]) * rstd[row], d}};
  }
};

}  // namespace

void layernorm_forward(Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const unsigned grid = static_cast<unsigned>(ceil_div(N, kWarpsPerBlock));
  layernorm_forward_kernel<<<grid, kWarpsPerBlock * kWarpSize, 0, ctx.stream>>>(
      out, mean, rstd, inp, weight, bias, N, C);
  KEEL_CHECK_LAUNCH();
}

void layernorm_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  if (N <= 0 || C <= 0) return;
  if (dinp != nullptr) {
    const unsigned grid = static_cast<unsigned>(ceil_div(N, kWarpsPerBlock));
    layernorm_backward_dinp_kernel<<<grid, kWarpsPerBlock * kWarpSize, 0, ctx.stream>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    KEEL_CHECK_LAUNCH();
  }
  if (dweight != nullptr || dbias != nullptr) {
    column_sums_accumulate<2>(ctx, ColumnOutputs<2>{{dweight, dbias}}, N, C,
                              LayerNormParamGrads{dout, inp, mean, rstd, C});
  }
}

}  // namespace keel::cuda
