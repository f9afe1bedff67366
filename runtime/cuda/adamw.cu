// AdamW (PyTorch's torch.optim.AdamW with bias correction): one thread per parameter, no
// reductions, so it is deterministic by construction. The gradient is scaled first
// (grad_scale carries clipping), then
//   m = β1·m + (1−β1)·g,  v = β2·v + (1−β2)·g²,
//   p −= lr·(m̂ / (√v̂ + ε) + wd·p),  m̂ = m/(1−β1ᵗ),  v̂ = v/(1−β2ᵗ),
// written in the same order as the CPU backend so the two agree to rounding. The inverse bias
// corrections are computed once on the host in double (1 − β2ᵗ loses digits in float).
#include <cmath>

#include "runtime/cuda/common.cuh"
#include "runtime/cuda/kernels.h"

namespace keel::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad,
                             float* __restrict__ m_mem, float* __restrict__ v_mem, size_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             float grad_scale, float inv_bc1, float inv_bc2) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float g = grad[i] * grad_scale;
    float m = beta1 * m_mem[i] + (1.0f - beta1) * g;
    float v = beta2 * v_mem[i] + (1.0f - beta2) * g * g;
    m_mem[i] = m;
    v_mem[i] = v;
    const float m_hat = m * inv_bc1;
    const float v_hat = v * inv_bc2;
    const float p = param[i];
    param[i] = p - lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * p);
  }
}

}  // namespace

void adamw(Context& ctx, float* param, const float* grad, float* m, float* v, size_t n,
           const AdamWParams& p) {
  if (n == 0) return;
  KEEL_CHECK(p.t >= 1, "AdamW step t must be >= 1, got ", p.t);
  const double t = static_cast<double>(p.t);
  const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(p.beta1), t)));
  const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(p.beta2), t)));
  adamw_kernel<<<grid_for(n, kBlock), kBlock, 0, ctx.stream>>>(param, grad, m, v, n, p.lr, p.beta1,
                                                               p.beta2, p.eps, p.weight_decay,
                                                               p.grad_scale, inv_bc1, inv_bc2);
  KEEL_CHECK_LAUNCH();
}

}  // namespace keel::cuda
