// Vocab-parallel softmax cross-entropy in three passes (see Backend::xent_* in
// runtime/backend.h): the runtime all-reduces row_max (max) and sum_exp/target_logit (sum)
// over TP between them, so no rank ever holds a full row of logits.
//
// Each pass is one block per row: rows are long (V_local is tens of thousands of columns) and
// there are B·T of them, so a block of threads strides through its row with coalesced loads
// and reduces with block_sum/block_max (common.cuh), whose order is fixed. Columns at or past
// vocab_size are padding and are excluded from the max and the sum and get a zero gradient.
//
// The last pass writes dlogits, which may alias logits: each element is read and then written
// by the same thread, so no pointer here is __restrict__.
#include <cmath>

#include "runtime/cuda/common.cuh"
#include "runtime/cuda/kernels.h"

namespace keel::cuda {
namespace {

constexpr int kBlock = 512;

// Local columns [0, valid) are real tokens.
__device__ inline int valid_columns(int V_local, int vocab_begin, int vocab_size) {
  return max(0, min(V_local, vocab_size - vocab_begin));
}

__global__ void row_max_kernel(float* row_max, const float* logits, int V_local, int vocab_begin,
                               int vocab_size) {
  __shared__ float shared[kWarpSize];
  const int row = blockIdx.x;
  const float* x = logits + static_cast<size_t>(row) * V_local;
  const int valid = valid_columns(V_local, vocab_begin, vocab_size);
  float m = -INFINITY;
  for (int i = threadIdx.x; i < valid; i += blockDim.x) m = fmaxf(m, x[i]);
  m = block_max(m, shared);
  if (threadIdx.x == 0) row_max[row] = m;
}

__global__ void sum_exp_kernel(float* sum_exp, float* target_logit, const float* logits,
                               const float* row_max, const int32_t* targets, int V_local,
                               int vocab_begin, int vocab_size) {
  __shared__ float shared[kWarpSize];
  const int row = blockIdx.x;
  const float* x = logits + static_cast<size_t>(row) * V_local;
  const int valid = valid_columns(V_local, vocab_begin, vocab_size);
  const float m = row_max[row];
  float s = 0.0f;
  for (int i = threadIdx.x; i < valid; i += blockDim.x) s += expf(x[i] - m);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) {
    sum_exp[row] = s;
    const int local = targets[row] - vocab_begin;
    target_logit[row] = (local >= 0 && local < valid) ? x[local] : 0.0f;
  }
}

__global__ void finish_kernel(float* losses, float* dlogits, const float* logits,
                              const float* row_max, const float* sum_exp, const float* target_logit,
                              const int32_t* targets, int V_local, int vocab_begin, int vocab_size,
                              float loss_scale) {
  const int row = blockIdx.x;
  const float m = row_max[row];
  const float s = sum_exp[row];
  if (threadIdx.x == 0) losses[row] = logf(s) + m - target_logit[row];
  if (dlogits == nullptr) return;
  const size_t base = static_cast<size_t>(row) * V_local;
  const int valid = valid_columns(V_local, vocab_begin, vocab_size);
  const int local_target = targets[row] - vocab_begin;
  const float inv_sum = 1.0f / s;
  for (int i = threadIdx.x; i < V_local; i += blockDim.x) {
    float g = 0.0f;
    if (i < valid) {
      const float p = expf(logits[base + i] - m) * inv_sum;
      g = loss_scale * (p - (i == local_target ? 1.0f : 0.0f));
    }
    dlogits[base + i] = g;
  }
}

}  // namespace

void xent_row_max(Context& ctx, float* row_max, const float* logits, int N, int V_local,
                  int vocab_begin, int vocab_size) {
  if (N <= 0) return;
  row_max_kernel<<<N, kBlock, 0, ctx.stream>>>(row_max, logits, V_local, vocab_begin, vocab_size);
  KEEL_CHECK_LAUNCH();
}

void xent_sum_exp(Context& ctx, float* sum_exp, float* target_logit, const float* logits,
                  const float* row_max, const int32_t* targets, int N, int V_local, int vocab_begin,
                  int vocab_size) {
  if (N <= 0) return;
  sum_exp_kernel<<<N, kBlock, 0, ctx.stream>>>(sum_exp, target_logit, logits, row_max, targets,
                                               V_local, vocab_begin, vocab_size);
  KEEL_CHECK_LAUNCH();
}

void xent_finish(Context& ctx, float* losses, float* dlogits, const float* logits,
                 const float* row_max, const float* sum_exp, const float* target_logit,
                 const int32_t* targets, int N, int V_local, int vocab_begin, int vocab_size,
                 float loss_scale) {
  if (N <= 0) return;
  finish_kernel<<<N, kBlock, 0, ctx.stream>>>(losses, dlogits, logits, row_max, sum_exp,
                                              target_logit, targets, V_local, vocab_begin,
                                              vocab_size, loss_scale);
  KEEL_CHECK_LAUNCH();
}

}  // namespace keel::cuda
