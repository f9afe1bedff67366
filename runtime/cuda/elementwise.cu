// Elementwise kernels (fill, add, scale, fp32→bf16) and the global sums the runtime reads on
// the host (loss sums, gradient norms, checksums).
//
// The elementwise kernels are memory-bound one-liners: a grid-stride loop with scalar loads,
// which stays near bandwidth for the sizes keel uses and needs no alignment or n % 4 rules.
//
// The global sum is the one reduction whose result leaves the GPU, so it must be identical
// run to run and on every GPU model: a fixed grid (kSumBlocks × kSumThreads, independent of the
// device) where thread i adds elements i, i + stride, ... in double, each block reduces its
// threads in a fixed tree, and a second single-block pass adds the block partials in a fixed
// tree. No atomics, and the partition depends only on n.
#include "runtime/cuda/common.cuh"
#include "runtime/cuda/kernels.h"

namespace keel::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kSumBlocks = 1024;
constexpr int kSumThreads = 256;

__global__ void fill_kernel(float* x, size_t n, float value) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] = value;
  }
}

// out may alias a or b: each element is read before it is written, by the same thread.
__global__ void add_kernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

__global__ void scale_kernel(float* x, size_t n, float s) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] *= s;
  }
}

__global__ void to_bf16_kernel(__nv_bfloat16* __restrict__ out, const float* __restrict__ in,
                               size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

// Pass 1: partials[block] = Σ of this block's strided share of x.
__global__ void sum_partials_kernel(double* partials, const float* x, size_t n, bool squares) {
  __shared__ double shared[kWarpSize];
  double acc = 0.0;
  const size_t stride = static_cast<size_t>(kSumBlocks) * kSumThreads;
  for (size_t i = blockIdx.x * static_cast<size_t>(kSumThreads) + threadIdx.x; i < n; i += stride) {
    double v = x[i];
    acc += squares ? v * v : v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 2 (one block): result = Σ partials, thread t first adding partials t, t + 256, ...
__global__ void sum_finish_kernel(double* result, const double* partials) {
  __shared__ double shared[kWarpSize];
  double acc = 0.0;
  for (int i = threadIdx.x; i < kSumBlocks; i += kSumThreads) acc += partials[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *result = acc;
}

}  // namespace

void fill(Context& ctx, float* x, size_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n, kBlock), kBlock, 0, ctx.stream>>>(x, n, value);
  KEEL_CHECK_LAUNCH();
}

void add(Context& ctx, float* out, const float* a, const float* b, size_t n) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, kBlock), kBlock, 0, ctx.stream>>>(out, a, b, n);
  KEEL_CHECK_LAUNCH();
}

void scale(Context& ctx, float* x, size_t n, float s) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n, kBlock), kBlock, 0, ctx.stream>>>(x, n, s);
  KEEL_CHECK_LAUNCH();
}

void to_bf16(Context& ctx, __nv_bfloat16* out, const float* in, size_t n) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_for(n, kBlock), kBlock, 0, ctx.stream>>>(out, in, n);
  KEEL_CHECK_LAUNCH();
}

double reduce_sum(Context& ctx, const float* x, size_t n, bool squares) {
  if (n == 0) return 0.0;
  double* partials = ctx.scratch.get<double>(Slot::kPartials, kSumBlocks + 1);
  double* result = partials + kSumBlocks;
  sum_partials_kernel<<<kSumBlocks, kSumThreads, 0, ctx.stream>>>(partials, x, n, squares);
  KEEL_CHECK_LAUNCH();
  sum_finish_kernel<<<1, kSumThreads, 0, ctx.stream>>>(result, partials);
  KEEL_CHECK_LAUNCH();
  auto* host = static_cast<double*>(ctx.pinned.get(sizeof(double)));
  KEEL_CHECK_CUDA(
      cudaMemcpyAsync(host, result, sizeof(double), cudaMemcpyDeviceToHost, ctx.stream));
  KEEL_CHECK_CUDA(cudaStreamSynchronize(ctx.stream));
  return *host;
}

}  // namespace keel::cuda
