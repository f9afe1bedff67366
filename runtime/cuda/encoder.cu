// Token + position embedding ("encoder" in llm.c), vocab-parallel: this rank holds rows
// [vocab_begin, vocab_end) of wte, and a token outside that range embeds to zero here (the TP
// all-reduce that follows adds the owning rank's row).
//
// Forward is a gather, one thread per output element.
//
// Backward is a scatter-add, which on a GPU is usually done with atomics; atomics make the
// order of the additions (and so the bits of dwte) depend on timing. Like llm.c's
// deterministic encoder_backward we instead bucket the positions by token on the host
// (tokens are B·T integers, cheap to copy) and launch one block row per distinct token whose
// threads, one per channel, add that token's positions in increasing order. Each dwte element
// is then written by exactly one thread, in a fixed order. dwpe needs no bucketing: thread
// (t, c) adds dout[b, t, c] over b in order.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "runtime/cuda/common.cuh"
#include "runtime/cuda/kernels.h"

namespace keel::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kChannelBlock = 128;

__global__ void embedding_forward_kernel(float* __restrict__ out,
                                         const int32_t* __restrict__ tokens,
                                         const float* __restrict__ wte,
                                         const float* __restrict__ wpe, int B, int T, int C,
                                         int vocab_begin, int vocab_end) {
  const size_t total = static_cast<size_t>(B) * T * C;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    const int tok = tokens[bt];
    float v = 0.0f;
    if (tok >= vocab_begin && tok < vocab_end) {
      v = wte[static_cast<size_t>(tok - vocab_begin) * C + c];
    }
    if (wpe != nullptr) v += wpe[static_cast<size_t>(t) * C + c];
    out[i] = v;
  }
}

// dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... in turn (the order of a sequential loop over
// positions, so the bits match the CPU backend's).
__global__ void dwpe_kernel(float* __restrict__ dwpe, const float* __restrict__ dout, int B, int T,
                            int C) {
  const size_t total = static_cast<size_t>(T) * C;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float s = dwpe[i];
    for (int b = 0; b < B; ++b) s += dout[static_cast<size_t>(b) * T * C + i];
    dwpe[i] = s;
  }
}

// Block (bucket, channel tile): dwte[row[bucket], c] += dout[pos, c] for the bucket's
// positions in increasing order, one addition at a time (as a sequential loop would).
__global__ void dwte_kernel(float* __restrict__ dwte, const float* __restrict__ dout,
                            const int32_t* __restrict__ bucket_row,
                            const int32_t* __restrict__ bucket_begin,
                            const int32_t* __restrict__ positions, int C) {
  const int bucket = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* w = dwte + static_cast<size_t>(bucket_row[bucket]) * C + c;
  float s = *w;
  for (int j = bucket_begin[bucket]; j < bucket_begin[bucket + 1]; ++j) {
    s += dout[static_cast<size_t>(positions[j]) * C + c];
  }
  *w = s;
}

}  // namespace

void embedding_forward(Context& ctx, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  embedding_forward_kernel<<<grid_for(total, kBlock), kBlock, 0, ctx.stream>>>(
      out, tokens, wte, wpe, B, T, C, vocab_begin, vocab_end);
  KEEL_CHECK_LAUNCH();
}

void embedding_backward(Context& ctx, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int B, int T, int C, int vocab_begin,
                        int vocab_end) {
  const int N = B * T;
  if (N == 0 || C == 0) return;
  if (dwpe != nullptr) {
    dwpe_kernel<<<grid_for(static_cast<size_t>(T) * C, kBlock), kBlock, 0, ctx.stream>>>(dwpe, dout,
                                                                                         B, T, C);
    KEEL_CHECK_LAUNCH();
  }
  if (dwte == nullptr || vocab_end <= vocab_begin) return;

  // One pinned buffer holds the tokens ([N]) followed by the tables the kernel reads:
  // bucket_row [K], bucket_begin [K + 1], positions [M], with K <= M <= N. Sized once, up front,
  // because get() may reallocate.
  auto* host =
      static_cast<int32_t*>(ctx.pinned.get((4 * static_cast<size_t>(N) + 1) * sizeof(int32_t)));
  KEEL_CHECK_CUDA(
      cudaMemcpyAsync(host, tokens, N * sizeof(int32_t), cudaMemcpyDeviceToHost, ctx.stream));
  KEEL_CHECK_CUDA(cudaStreamSynchronize(ctx.stream));

  // (token, position) pairs sorted: positions of one token end up contiguous and ascending.
  std::vector<std::pair<int32_t, int32_t>> order;
  order.reserve(N);
  for (int i = 0; i < N; ++i) {
    if (host[i] >= vocab_begin && host[i] < vocab_end) order.emplace_back(host[i], i);
  }
  if (order.empty()) return;
  std::sort(order.begin(), order.end());
  std::vector<int32_t> bucket_row, bucket_begin;
  const int M = static_cast<int>(order.size());
  for (int j = 0; j < M; ++j) {
    if (j == 0 || order[j].first != order[j - 1].first) {
      bucket_row.push_back(order[j].first - vocab_begin);
      bucket_begin.push_back(j);
    }
  }
  bucket_begin.push_back(M);
  const int K = static_cast<int>(bucket_row.size());

  int32_t* table = host + N;
  std::memcpy(table, bucket_row.data(), K * sizeof(int32_t));
  std::memcpy(table + K, bucket_begin.data(), (K + 1) * sizeof(int32_t));
  for (int j = 0; j < M; ++j) table[2 * K + 1 + j] = order[j].second;
  const size_t table_len = static_cast<size_t>(2 * K + 1 + M);
  auto* dev = ctx.scratch.get<int32_t>(Slot::kIndex, table_len);
  // The pinned table stays untouched until this copy has run: every later writer of the
  // pinned buffer is a copy queued behind it on the same stream, or runs after a stream
  // synchronize (this function, and PinnedBuffer::get when it grows).
  KEEL_CHECK_CUDA(
      cudaMemcpyAsync(dev, table, table_len * sizeof(int32_t), cudaMemcpyHostToDevice, ctx.stream));
  dim3 grid(static_cast<unsigned>(K), static_cast<unsigned>(ceil_div(C, kChannelBlock)));
  dwte_kernel<<<grid, kChannelBlock, 0, ctx.stream>>>(dwte, dout, dev, dev + K, dev + 2 * K + 1, C);
  KEEL_CHECK_LAUNCH();
}

}  // namespace keel::cuda
