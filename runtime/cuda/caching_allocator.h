// Device memory for one CUDA backend. cudaMalloc and cudaFree synchronize the device and
// cost tens of microseconds to milliseconds, so a step that allocates scratch would stall on
// them; instead freed blocks are kept in per-size-class free lists and handed out again.
//
// Blocks are never split or merged: a request is rounded up to its size class and served by a
// free block of exactly that class, else by a fresh cudaMalloc (never managed memory). That
// wastes at most a quarter of a small block, or 2 MiB of a large one, and keeps the bookkeeping
// trivially correct. On out-of-memory the cache is returned to the driver and the cudaMalloc
// is retried once.
//
// Reuse is ordered by the stream: the allocator belongs to one stream, and a block freed while
// kernels on that stream still use it is only handed to work queued later on the same stream.
// A caller that touches a block from another stream must synchronize that stream before free.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace keel::cuda {

struct AllocatorStats {
  uint64_t cuda_mallocs = 0;  // blocks obtained from the driver since creation
  uint64_t cache_hits = 0;    // allocations served from a free list
  size_t bytes_in_use = 0;    // size-class bytes held by callers
  size_t bytes_cached = 0;    // size-class bytes in free lists
};

class CachingAllocator {
 public:
  // Allocates on `device`; zero-fills and orders reuse on `stream`.
  CachingAllocator(int device, cudaStream_t stream);
  ~CachingAllocator();  // returns every block to the driver
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Zero-filled (cudaMemsetAsync on the stream), at least 256-byte aligned; bytes == 0 gives
  // nullptr. Throws keel::Error when the device is out of memory even after releasing the cache.
  void* alloc(size_t bytes);
  // Returns p to its free list; nullptr is a no-op; a pointer not from alloc throws keel::Error.
  void free(void* p);
  // Synchronizes the stream and returns every cached (free) block to the driver.
  void release_cached();

  AllocatorStats stats() const;

  // The size class a request of `bytes` is served from.
  static size_t size_class(size_t bytes);

 private:
  void release_cached_locked();

  int device_;
  cudaStream_t stream_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class → free blocks
  std::unordered_map<void*, size_t> live_;     // block → its size class
  AllocatorStats stats_;
};

}  // namespace keel::cuda
