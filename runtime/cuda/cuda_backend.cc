// The CUDA Backend: one GPU, one compute stream, one cuBLAS handle bound to it, and a caching
// allocator. Every method queues its work on that stream; only the methods that return data
// to the host (copy_to_host, sum, sum_squares) or read host memory (copy_from_host) wait.
//
// The stream is created blocking (not cudaStreamNonBlocking) on purpose: the NCCL
// communicator orders its collectives after compute by recording an event on the legacy
// default stream, which waits for all blocking streams of the device (parallel/nccl/).
#include <memory>
#include <string>

#include "runtime/backend.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"

namespace keel {
namespace {

// Hopper's recommended cuBLAS workspace. Pinning one workspace per handle (instead of letting
// cuBLAS allocate per call) is also part of keeping GEMM algorithm choice, and so the bits,
// fixed from call to call.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, Precision precision) : device_(device) {
    try {
      init(precision);
    } catch (...) {
      release();  // the destructor does not run for a constructor that throws
      throw;
    }
  }

  ~CudaBackend() override { release(); }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }

  void* alloc(size_t bytes) override {
    activate();
    return allocator_->alloc(bytes);
  }
  void free(void* p) override { allocator_->free(p); }

  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    activate();
    KEEL_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    KEEL_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }
  // Waits too: the caller may reuse or free its host buffer as soon as this returns, and if
  // that buffer is pinned an asynchronous copy would still be reading it.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    activate();
    KEEL_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    KEEL_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    activate();
    KEEL_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void synchronize() override {
    activate();
    KEEL_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }

  void fill(float* x, size_t n, float value) override {
    activate();
    cuda::fill(*ctx_, x, n, value);
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
    activate();
    cuda::add(*ctx_, out, a, b, n);
  }
  void scale(float* x, size_t n, float s) override {
    activate();
    cuda::scale(*ctx_, x, n, s);
  }

  double sum(const float* x, size_t n) override {
    activate();
    return cuda::reduce_sum(*ctx_, x, n, false);
  }
  double sum_squares(const float* x, size_t n) override {
    activate();
    return cuda::reduce_sum(*ctx_, x, n, true);
  }

  void adamw(float* param, const float* grad, float* m, float* v, size_t n,
             const AdamWParams& p) override {
    activate();
    cuda::adamw(*ctx_, param, grad, m, v, n, p);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int B, int T, int C, int vocab_begin, int vocab_end) override {
    activate();
    cuda::embedding_forward(*ctx_, out, tokens, wte, wpe, B, T, C, vocab_begin, vocab_end);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                          int T, int C, int vocab_begin, int vocab_end) override {
    activate();
    cuda::embedding_backward(*ctx_, dwte, dwpe, dout, tokens, B, T, C, vocab_begin, vocab_end);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    activate();
    cuda::layernorm_forward(*ctx_, out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    activate();
    cuda::layernorm_backward(*ctx_, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override {
    activate();
    cuda::matmul_forward(*ctx_, out, inp, weight, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override {
    activate();
    cuda::matmul_backward(*ctx_, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH,
                         int HS) override {
    activate();
    cuda::attention_forward(*ctx_, out, att, qkv, B, T, NH, HS);
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* att, int B, int T, int NH, int HS) override {
    activate();
    cuda::attention_backward(*ctx_, dqkv, scratch, dout, qkv, att, B, T, NH, HS);
  }
  void gelu_forward(float* out, const float* inp, size_t n) override {
    activate();
    cuda::gelu_forward(*ctx_, out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    activate();
    cuda::gelu_backward(*ctx_, dinp, inp, dout, n);
  }

  void xent_row_max(float* row_max, const float* logits, int N, int V_local, int vocab_begin,
                    int vocab_size) override {
    activate();
    cuda::xent_row_max(*ctx_, row_max, logits, N, V_local, vocab_begin, vocab_size);
  }
  void xent_sum_exp(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                    const int32_t* targets, int N, int V_local, int vocab_begin,
                    int vocab_size) override {
    activate();
    cuda::xent_sum_exp(*ctx_, sum_exp, target_logit, logits, row_max, targets, N, V_local,
                       vocab_begin, vocab_size);
  }
  void xent_finish(float* losses, float* dlogits, const float* logits, const float* row_max,
                   const float* sum_exp, const float* target_logit, const int32_t* targets, int N,
                   int V_local, int vocab_begin, int vocab_size, float loss_scale) override {
    activate();
    cuda::xent_finish(*ctx_, losses, dlogits, logits, row_max, sum_exp, target_logit, targets, N,
                      V_local, vocab_begin, vocab_size, loss_scale);
  }

 private:
  // The calling thread's current device may be another backend's (one process can drive
  // several GPUs), so every entry point selects ours first; cudaSetDevice is cheap when it is
  // already current.
  void activate() { KEEL_CHECK_CUDA(cudaSetDevice(device_)); }

  void init(Precision precision) {
    KEEL_CHECK_CUDA(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    KEEL_CHECK_CUDA(cudaGetDeviceProperties(&prop, device_));
    name_ = "cuda:" + std::to_string(device_) + " " + prop.name;
    KEEL_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
    KEEL_CHECK_CUBLAS(cublasCreate(&cublas_));
    KEEL_CHECK_CUBLAS(cublasSetStream(cublas_, stream_));
    KEEL_CHECK_CUDA(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
    KEEL_CHECK_CUBLAS(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
    // No atomics inside cuBLAS (the default, stated here because determinism depends on it),
    // and no TF32: kFp32 means true fp32, kBf16 asks for bf16 operands explicitly.
    KEEL_CHECK_CUBLAS(cublasSetAtomicsMode(cublas_, CUBLAS_ATOMICS_NOT_ALLOWED));
    KEEL_CHECK_CUBLAS(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    allocator_ = std::make_unique<cuda::CachingAllocator>(device_, stream_);
    ctx_ = std::make_unique<cuda::Context>(device_, stream_, cublas_, precision, allocator_.get());
  }

  // Frees whatever init created. Nothing here may throw; errors while tearing down are ignored.
  void release() noexcept {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    ctx_.reset();
    allocator_.reset();
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (cublas_workspace_ != nullptr) cudaFree(cublas_workspace_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    cudaGetLastError();
  }

  int device_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  std::unique_ptr<cuda::CachingAllocator> allocator_;
  std::unique_ptr<cuda::Context> ctx_;
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error the next CUDA call should see
    return 0;
  }
  return count;
}

bool cuda_available() {
  return cuda_device_count() > 0;
}

std::unique_ptr<Backend> make_cuda_backend(int device, Precision precision) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) cudaGetLastError();
  KEEL_CHECK(err == cudaSuccess && count > 0, "no CUDA device is available (",
             cudaGetErrorString(err), ")");
  KEEL_CHECK(device >= 0 && device < count, "CUDA device ", device, " does not exist (", count,
             " visible)");
  return std::make_unique<CudaBackend>(device, precision);
}

}  // namespace keel
