// AdamW with bias correction and decoupled weight decay, as PyTorch's torch.optim.AdamW:
//   g = grad_scale·grad; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²
//   p −= lr·(m̂ / (√v̂ + ε) + wd·p), with m̂ = m / (1−β1^t), v̂ = v / (1−β2^t).
// Purely elementwise, so any static split over threads gives the same bits.
#include <cmath>

#include "runtime/check.h"
#include "runtime/cpu/kernels.h"

namespace keel::cpu {

void adamw(int nt, float* param, const float* grad, float* m, float* v, size_t n,
           const AdamWParams& p) {
  KEEL_CHECK(p.t >= 1, "AdamW step t must be >= 1, got ", p.t);
  // Bias corrections in double: 1 − β2^t is tiny for small t and loses digits in float.
  const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(double(p.beta1), double(p.t))));
  const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(double(p.beta2), double(p.t))));
  const float b1 = p.beta1, b2 = p.beta2, lr = p.lr, eps = p.eps, wd = p.weight_decay;
  const float gs = p.grad_scale;
#pragma omp parallel for num_threads(nt) schedule(static) if (n >= (1 << 14))
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * gs;
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi * inv_bc1;
    const float vhat = vi * inv_bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * param[i]);
  }
}

}  // namespace keel::cpu
