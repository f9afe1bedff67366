// AdamW with bias correction and decoupled weight decay, as PyTorch's torch.optim.AdamW:
//   g = grad_scale·grad; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²
//   p −= lr·(m̂ / (√v̂ + ε) + wd·p), with m̂ = m / (1−β1^t), v̂ = v / (1−β2^t).
// Purely elementwise, so any static split over threads gives the same bits.
//
// This file is compiled with -fno-math-errno (runtime/CMakeLists.txt): with errno to set,
// GCC calls sqrtf for every element and cannot vectorise the loop. The square root and the
// division are correctly rounded IEEE operations either way, so the vector loop gives the
// same bits as the scalar one (and as adamw_element anywhere else); v̂ is never negative.
#include <omp.h>

#include "runtime/check.h"
#include "runtime/cpu/kernels.h"

namespace keel::cpu {

void adamw_span(const AdamWConstants& c, float wd, const float* param, const float* grad,
                const float* m, const float* v, float* param_out, float* m_out, float* v_out,
                size_t n) {
  // simd: outputs may alias inputs element for element, which a vector loop allows; without
  // it GCC gives up on the seven-pointer alias checks.
#pragma omp simd
  for (size_t i = 0; i < n; ++i)
    adamw_element(c, wd, param, grad, m, v, param_out, m_out, v_out, i, i);
}

void adamw(int nt, float* param, const float* grad, float* m, float* v, size_t n,
           const AdamWParams& p) {
  KEEL_CHECK(p.t >= 1, "AdamW step t must be >= 1, got ", p.t);
  const AdamWConstants c(p);
#pragma omp parallel num_threads(nt) if (n >= (1 << 14))
  {
    size_t b, e;
    static_range(n, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
    adamw_span(c, p.weight_decay, param + b, grad + b, m + b, v + b, param + b, m + b, v + b,
               e - b);
  }
}

}  // namespace keel::cpu
