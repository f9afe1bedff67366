// The AdamW arithmetic of one element, shared by the in-place step (adamw.cc) and the
// out-of-place one (adamw_update.cc) so that both give the same bits: a state updated in its
// snapshot slots trains exactly like one updated where it lies.
#pragma once

#include <cmath>

#include "runtime/backend.h"

namespace keel::cpu {

// Constants of one step, computed once per call.
struct AdamWConstants {
  float b1, b2, lr, eps, gs, inv_bc1, inv_bc2;
  explicit AdamWConstants(const AdamWParams& p)
      : b1(p.beta1),
        b2(p.beta2),
        lr(p.lr),
        eps(p.eps),
        gs(p.grad_scale),
        // Bias corrections in double: 1 − β2^t is tiny for small t and loses digits in float.
        inv_bc1(static_cast<float>(1.0 / (1.0 - std::pow(double(p.beta1), double(p.t))))),
        inv_bc2(static_cast<float>(1.0 / (1.0 - std::pow(double(p.beta2), double(p.t))))) {}
};

// Reads element i of (param, grad, m, v) and writes the updated values to the outputs,
// which may alias the inputs.
inline void adamw_element(const AdamWConstants& c, float wd, const float* param, const float* grad,
                          const float* m, const float* v, float* param_out, float* m_out,
                          float* v_out, size_t i, size_t im) {
  const float g = grad[i] * c.gs;
  const float mi = c.b1 * m[im] + (1.0f - c.b1) * g;
  const float vi = c.b2 * v[im] + (1.0f - c.b2) * g * g;
  m_out[im] = mi;
  v_out[im] = vi;
  const float mhat = mi * c.inv_bc1;
  const float vhat = vi * c.inv_bc2;
  const float pi = param[i];
  param_out[i] = pi - c.lr * (mhat / (std::sqrt(vhat) + c.eps) + wd * pi);
}

}  // namespace keel::cpu
