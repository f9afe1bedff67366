// What every CUDA kernel launcher needs: the backend's device, its one compute stream, the
// cuBLAS handle bound to that stream, the GEMM precision, and backend-owned scratch memory
// (bf16 copies of GEMM operands, attention's permuted q/k/v, reduction partials).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>

#include "runtime/backend.h"
#include "runtime/cuda/caching_allocator.h"

namespace keel::cuda {

// Named scratch buffers. Every call that needs a slot reuses it; calls run in order on one
// stream, so a slot never serves two kernels at once and needs no synchronization.
enum class Slot {
  kOperandA,  // bf16 copies of GEMM operands (matmul and attention)
  kOperandB,
  kOperandC,
  kOperandD,
  kAttention,  // fp32 permuted q/k/v and their gradients
  kPartials,   // per-chunk partial sums of the deterministic reductions
  kIndex,      // integer tables uploaded from the host (embedding backward buckets)
  kCount
};

class Scratch {
 public:
  explicit Scratch(CachingAllocator* allocator) : allocator_(allocator) {}
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // At least `bytes` of device memory; contents are unspecified. Growing frees the old block
  // back to the allocator, which only reuses it for work queued after this point.
  void* get(Slot slot, size_t bytes);
  template <typename T>
  T* get(Slot slot, size_t count) {
    return static_cast<T*>(get(slot, count * sizeof(T)));
  }

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  CachingAllocator* allocator_;
  std::array<Buffer, static_cast<size_t>(Slot::kCount)> buffers_{};
};

// Pinned host memory, so device-to-host results and host-to-device tables copy by DMA.
class PinnedBuffer {
 public:
  // Growing waits for `stream`, whose queued copies may still read the old buffer.
  explicit PinnedBuffer(cudaStream_t stream) : stream_(stream) {}
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  // At least `bytes`; the caller must have synchronized any copy still reading the old one.
  void* get(size_t bytes);

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct Context {
  Context(int device, cudaStream_t stream, cublasHandle_t cublas, Precision precision,
          CachingAllocator* allocator)
      : device(device),
        stream(stream),
        cublas(cublas),
        precision(precision),
        scratch(allocator),
        pinned(stream) {}

  int device;
  cudaStream_t stream;
  cublasHandle_t cublas;
  Precision precision;
  Scratch scratch;
  PinnedBuffer pinned;
};

}  // namespace keel::cuda
