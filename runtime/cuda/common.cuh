// Device helpers shared by the CUDA kernels: launch-size arithmetic, warp and block
// reductions, and the deterministic column reduction used by every parameter-gradient sum
// (matmul dbias, LayerNorm dweight/dbias).
//
// Determinism (see DESIGN.md): every reduction here adds in an order fixed by compile-time
// constants, never by the GPU's size or by thread timing, and never with atomics. So the same
// inputs give the same bits on every run and on every GPU model.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "runtime/cuda/context.h"
#include "runtime/cuda/cuda_check.h"

namespace keel::cuda {

constexpr int kWarpSize = 32;

inline __host__ __device__ constexpr size_t ceil_div(size_t a, size_t b) {
  return (a + b - 1) / b;
}

// Blocks for a grid-stride loop over n elements: enough to fill an H100/H200 several times,
// capped so that huge n is covered by striding rather than by a giant grid.
inline unsigned grid_for(size_t n, int block) {
  size_t blocks = ceil_div(n, static_cast<size_t>(block));
  return static_cast<unsigned>(blocks < 8192 ? (blocks == 0 ? 1 : blocks) : 8192);
}

// Butterfly reductions: every lane ends with the result, and the pairing order is fixed.
template <typename T>
__device__ inline T warp_sum(T v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

__device__ inline float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum over a whole block (blockDim.x a multiple of 32, at most 1024): warps reduce, then warp 0
// reduces the per-warp results. Every thread gets the result. `shared` holds 32 values.
template <typename T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < num_warps ? shared[lane] : T(0);
  return warp_sum(v);
}

__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < num_warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// ---------------------------------------------------------------------------------------------
// Column sums of a [rows, cols] matrix, accumulated (+=) into K output vectors of cols floats.
// Pass 1: a block owns 32 adjacent columns (one warp reads 32 consecutive floats: coalesced)
// and one chunk of kChunkRows rows; its 8 row lanes stride through the chunk and their sums
// are added lane by lane. Pass 2: one thread per column adds the chunk partials in order.
// Two passes instead of atomics keep the order fixed; chunking keeps the GPU busy when
// cols is small (a 768-wide bias has only 24 column tiles).

constexpr int kColTile = 32;
constexpr int kRowLanes = 8;
constexpr int kChunkRows = 64;

template <int K>
struct ColumnValues {
  float v[K];
};

template <int K>
struct ColumnOutputs {
  float* out[K];  // a null output is skipped
};

// Load is a functor: ColumnValues<K> operator()(int row, int col) const.
template <int K, typename Load>
__global__ void column_partials_kernel(float* partials, int rows, int cols, Load load) {
  __shared__ float lanes[K][kRowLanes][kColTile];
  const int col = blockIdx.x * kColTile + threadIdx.x;
  const int chunk = blockIdx.y;
  const int row_end = min(rows, (chunk + 1) * kChunkRows);
  float acc[K];
  for (int k = 0; k < K; ++k) acc[k] = 0.0f;
  if (col < cols) {
    for (int r = chunk * kChunkRows + threadIdx.y; r < row_end; r += kRowLanes) {
      ColumnValues<K> x = load(r, col);
      for (int k = 0; k < K; ++k) acc[k] += x.v[k];
    }
  }
  for (int k = 0; k < K; ++k) lanes[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int k = 0; k < K; ++k) {
      float s = 0.0f;
      for (int y = 0; y < kRowLanes; ++y) s += lanes[k][y][threadIdx.x];
      partials[(static_cast<size_t>(k) * gridDim.y + chunk) * cols + col] = s;
    }
  }
}

template <int K>
__global__ void column_finish_kernel(ColumnOutputs<K> outs, const float* partials, int chunks,
                                     int cols) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  for (int k = 0; k < K; ++k) {
    if (outs.out[k] == nullptr) continue;
    float s = 0.0f;
    for (int c = 0; c < chunks; ++c)
      s += partials[(static_cast<size_t>(k) * chunks + c) * cols + col];
    outs.out[k][col] += s;
  }
}

template <int K, typename Load>
void column_sums_accumulate(Context& ctx, ColumnOutputs<K> outs, int rows, int cols, Load load) {
  if (rows <= 0 || cols <= 0) return;
  const int chunks = static_cast<int>(ceil_div(rows, kChunkRows));
  KEEL_CHECK(chunks <= 65535, "column reduction over ", rows, " rows exceeds the grid limit");
  float* partials = ctx.scratch.get<float>(Slot::kPartials, static_cast<size_t>(K) * chunks * cols);
  dim3 grid(static_cast<unsigned>(ceil_div(cols, kColTile)), static_cast<unsigned>(chunks));
  column_partials_kernel<K>
      <<<grid, dim3(kColTile, kRowLanes), 0, ctx.stream>>>(partials, rows, cols, load);
  KEEL_CHECK_LAUNCH();
  column_finish_kernel<K><<<static_cast<unsigned>(ceil_div(cols, 256)), 256, 0, ctx.stream>>>(
      outs, partials, chunks, cols);
  KEEL_CHECK_LAUNCH();
}

}  // namespace keel::cuda
