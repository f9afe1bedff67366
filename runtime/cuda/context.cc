#include "runtime/cuda/context.h"

#include "runtime/cuda/cuda_check.h"

namespace keel::cuda {

Scratch::~Scratch() {
  for (Buffer& b : buffers_) {
    try {
      allocator_->free(b.ptr);
    } catch (const Error&) {
      // The allocator outlives its scratch; a failure here means it was torn down first.
    }
  }
}

void* Scratch::get(Slot slot, size_t bytes) {
  Buffer& b = buffers_[static_cast<size_t>(slot)];
  if (bytes > b.bytes) {
    allocator_->free(b.ptr);
    b.ptr = nullptr;
    b.bytes = 0;
    // Grow to the size class, so slowly increasing requests do not reallocate each time.
    size_t cls = CachingAllocator::size_class(bytes);
    b.ptr = allocator_->alloc(cls);
    b.bytes = cls;
  }
  return b.ptr;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

void* PinnedBuffer::get(size_t bytes) {
  if (bytes > bytes_) {
    if (ptr_ != nullptr) {
      KEEL_CHECK_CUDA(cudaStreamSynchronize(stream_));
      KEEL_CHECK_CUDA(cudaFreeHost(ptr_));
    }
    ptr_ = nullptr;
    bytes_ = 0;
    size_t cls = CachingAllocator::size_class(bytes);
    KEEL_CHECK_CUDA(cudaMallocHost(&ptr_, cls));
    bytes_ = cls;
  }
  return ptr_;
}

}  // namespace keel::cuda
