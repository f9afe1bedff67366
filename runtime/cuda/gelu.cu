// GELU, tanh approximation (GPT-2's), one thread per element. Forward overwrites out; backward
// ACCUMULATES into dinp (keel_ops' rule for gradients), so no reductions and nothing to order.
#include "runtime/cuda/common.cuh"
#include "runtime/cuda/kernels.h"

namespace keel::cuda {
namespace {

constexpr int kBlock = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/π)

__global__ void gelu_forward_kernel(float* __restrict__ out, const float* __restrict__ inp,
                                    size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
  }
}

__global__ void gelu_backward_kernel(float* __restrict__ dinp, const float* __restrict__ inp,
                                     const float* __restrict__ dout, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    const float tanh_arg = kGeluScale * (x + cube);
    const float tanh_out = tanhf(tanh_arg);
    const float cosh_out = coshf(tanh_arg);
    const float sech2 = 1.0f / (cosh_out * cosh_out);
    const float local_grad = 0.5f * (1.0f + tanh_out) +
                             x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local_grad * dout[i];
  }
}

}  // namespace

void gelu_forward(Context& ctx, float* out, const float* inp, size_t n) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n, kBlock), kBlock, 0, ctx.stream>>>(out, inp, n);
  KEEL_CHECK_LAUNCH();
}

void gelu_backward(Context& ctx, float* dinp, const float* inp, const float* dout, size_t n) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n, kBlock), kBlock, 0, ctx.stream>>>(dinp, inp, dout, n);
  KEEL_CHECK_LAUNCH();
}

}  // namespace keel::cuda
