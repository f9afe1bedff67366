// Error checks for the CUDA runtime and cuBLAS, in the style of runtime/check.h: a failed call
// throws keel::Error naming file:line, the call's text and the library's own error string.
// A CUDA error inside the CUDA backend is never something keel survives in place (a sticky
// error poisons the context), so these are plain keel::Error, not the CommError family.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "runtime/check.h"

namespace keel::detail {

[[noreturn]] inline void throw_cuda(const char* file, int line, const char* expr, cudaError_t err) {
  // A failed call is also recorded as the thread's last error; reported here, it must not be
  // reported again by the next launch check (cudaGetLastError) of unrelated work.
  cudaGetLastError();
  throw_check(file, line, expr, concat(cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

[[noreturn]] inline void throw_cublas(const char* file, int line, const char* expr,
                                      cublasStatus_t status) {
  throw_check(file, line, expr,
              concat(cublasGetStatusName(status), ": ", cublasGetStatusString(status)));
}

}  // namespace keel::detail

// KEEL_CHECK_CUDA(cudaMalloc(&p, n)): throws keel::Error unless the call returns cudaSuccess.
#define KEEL_CHECK_CUDA(call)                                                \
  do {                                                                       \
    cudaError_t keel_cuda_err_ = (call);                                     \
    if (keel_cuda_err_ != cudaSuccess) {                                     \
      ::keel::detail::throw_cuda(__FILE__, __LINE__, #call, keel_cuda_err_); \
    }                                                                        \
  } while (0)

// KEEL_CHECK_CUBLAS(cublasSgemm(...)): throws keel::Error unless CUBLAS_STATUS_SUCCESS.
#define KEEL_CHECK_CUBLAS(call)                                                     \
  do {                                                                              \
    cublasStatus_t keel_cublas_status_ = (call);                                    \
    if (keel_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                             \
      ::keel::detail::throw_cublas(__FILE__, __LINE__, #call, keel_cublas_status_); \
    }                                                                               \
  } while (0)

// After a kernel launch: launch errors (bad configuration, no kernel image for this GPU)
// are reported by cudaGetLastError, not by the launch itself.
#define KEEL_CHECK_LAUNCH() KEEL_CHECK_CUDA(cudaGetLastError())
