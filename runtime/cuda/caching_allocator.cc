#include "runtime/cuda/caching_allocator.h"

#include <bit>

#include "runtime/cuda/cuda_check.h"

namespace keel::cuda {
namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;  // above: 2 MiB granularity
constexpr size_t kLargeGranularity = size_t{2} << 20;

}  // namespace

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  if (bytes > kLargeThreshold) {
    return (bytes + kLargeGranularity - 1) / kLargeGranularity * kLargeGranularity;
  }
  // Four classes per power of two (e.g. 4096, 5120, 6144, 7168): at most 25% waste, and few
  // enough classes that blocks freed by one step fit the next step's requests.
  size_t pow2 = std::bit_floor(bytes - 1);
  size_t quarter = pow2 / 4;
  return (bytes + quarter - 1) / quarter * quarter;
}

CachingAllocator::CachingAllocator(int device, cudaStream_t stream)
    : device_(device), stream_(stream) {}

CachingAllocator::~CachingAllocator() {
  // Destructors must not throw: errors here (a context already torn down at exit) are ignored.
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) cudaFree(p);
  }
  for (auto& [p, cls] : live_) cudaFree(p);
  if (prev >= 0) cudaSetDevice(prev);
}

void* CachingAllocator::alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  KEEL_CHECK_CUDA(cudaSetDevice(device_));
  void* p = nullptr;
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cache_hits++;
    stats_.bytes_cached -= cls;
  } else {
    cudaError_t err = cudaMalloc(&p, cls);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it so that later launches do not report it
      release_cached_locked();
      err = cudaMalloc(&p, cls);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      detail::throw_check(__FILE__, __LINE__, "cudaMalloc",
                          detail::concat(cudaGetErrorString(err), " (", bytes, " bytes on device ",
                                         device_, "; ", stats_.bytes_in_use, " bytes in use)"));
    }
    stats_.cuda_mallocs++;
  }
  live_.emplace(p, cls);
  stats_.bytes_in_use += cls;
  // The interface promises zeroed memory; queueing the memset on the stream keeps alloc cheap
  // and orders it before any later kernel that uses the block.
  KEEL_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, stream_));
  return p;
}

void CachingAllocator::free(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  KEEL_CHECK(it != live_.end(), "free of a pointer this CUDA backend did not allocate: ", p);
  const size_t cls = it->second;
  live_.erase(it);
  free_[cls].push_back(p);
  stats_.bytes_in_use -= cls;
  stats_.bytes_cached += cls;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  KEEL_CHECK_CUDA(cudaSetDevice(device_));
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  // Queued kernels may still use a cached block (reuse is stream-ordered), so they must finish
  // before the block goes back to the driver.
  KEEL_CHECK_CUDA(cudaStreamSynchronize(stream_));
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) KEEL_CHECK_CUDA(cudaFree(p));
  }
  free_.clear();
  stats_.bytes_cached = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace keel::cuda
