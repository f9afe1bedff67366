// The kernels a Llama-style block adds to GPT-2's: RMSNorm, SwiGLU and rotary position
// embeddings (semantics on keel_ops in model/plugin.h). Like layernorm.cc, row work is split
// over rows with static schedules, and RMSNorm's dweight, a reduction over rows, runs in a
// second pass split over columns with each column summed in ascending row order, so results
// are bitwise repeatable for a given thread count.
#include <omp.h>

#include <cmath>
#include <vector>

#include "runtime/cpu/kernels.h"

namespace keel::cpu {

namespace {
constexpr float kRmsEps = 1e-5f;

float sigmoid(float g) {
  return 1.0f / (1.0f + exp_approx(-g));
}

// cos and sin of t·theta^(-2i/HS) for t < T, i < HS/2, as [T, HS/2] each. Computed in double
// and rounded once, so the table does not depend on how a compiler orders float operations.
void rope_table(int T, int HS, float theta, std::vector<float>* cos_t, std::vector<float>* sin_t) {
  const int half = HS / 2;
  cos_t->resize(size_t(T) * half);
  sin_t->resize(size_t(T) * half);
  for (int i = 0; i < half; ++i) {
    const double freq = std::pow(double(theta), -2.0 * i / HS);
    for (int t = 0; t < T; ++t) {
      const double a = t * freq;
      (*cos_t)[size_t(t) * half + i] = float(std::cos(a));
      (*sin_t)[size_t(t) * half + i] = float(std::sin(a));
    }
  }
}

// Rotates the q and k heads of every (b, t) row of a [B,T,3,NH,HS] buffer by the table's
// angles, times `sign` (+1 forward, −1 for the inverse).
void rope_apply(int nt, float* qkv, int B, int T, int NH, int HS, float theta, float sign) {
  std::vector<float> cos_t, sin_t;
  rope_table(T, HS, theta, &cos_t, &sin_t);
  const int half = HS / 2;
  const size_t row = size_t(3) * NH * HS;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int bt = 0; bt < B * T; ++bt) {
    const int t = bt % T;
    const float* c = &cos_t[size_t(t) * half];
    const float* s = &sin_t[size_t(t) * half];
    float* x = qkv + size_t(bt) * row;
    // q and k are the first 2·NH heads of the row.
    for (int h = 0; h < 2 * NH; ++h) {
      float* v = x + size_t(h) * HS;
      for (int i = 0; i < half; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1], si = sign * s[i];
        v[2 * i] = x0 * c[i] - x1 * si;
        v[2 * i + 1] = x0 * si + x1 * c[i];
      }
    }
  }
}
}  // namespace

void rmsnorm_forward(int nt, float* out, float* rstd, const float* inp, const float* weight, int N,
                     int C) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t at = static_cast<size_t>(n) * C;
    const float* x = inp + at;
    const float s = 1.0f / std::sqrt(lane_dot(x, x, C) / static_cast<float>(C) + kRmsEps);
    float* o = out + at;
    for (int i = 0; i < C; ++i) o[i] = x[i] * s * weight[i];
    rstd[n] = s;
  }
}

void rmsnorm_backward(int nt, float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
#pragma omp parallel num_threads(nt)
  {
    // Pass 1, rows: dinp += rstd·w·dout − inp·rstd³·mean(w·dout·inp).
#pragma omp for schedule(static) nowait
    for (int n = 0; n < N; ++n) {
      const size_t at = static_cast<size_t>(n) * C;
      const float *x = inp + at, *d = dout + at;
      const float s = rstd[n];
      float acc[8] = {};
      for (int i = 0; i < C; ++i) acc[i & 7] += weight[i] * d[i] * x[i];
      const float dot =
          ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      const float k = s * s * s * dot / static_cast<float>(C);
      float* di = dinp + at;
      for (int j = 0; j < C; ++j) di[j] += s * weight[j] * d[j] - x[j] * k;
    }
    // Pass 2, columns; no barrier: the passes write different arrays and read only inputs.
    size_t c0, c1;
    static_range(C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<size_t>(n) * C;
      const float* d = dout + static_cast<size_t>(n) * C;
      const float s = rstd[n];
      for (size_t j = c0; j < c1; ++j) dweight[j] += d[j] * (x[j] * s);
    }
  }
}

void swiglu_forward(int nt, float* out, const float* gate_up, int N, int F) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* g = gate_up + size_t(n) * 2 * F;
    const float* u = g + F;
    float* o = out + size_t(n) * F;
    for (int j = 0; j < F; ++j) o[j] = g[j] * sigmoid(g[j]) * u[j];
  }
}

void swiglu_backward(int nt, float* dgate_up, const float* gate_up, const float* dout, int N,
                     int F) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* g = gate_up + size_t(n) * 2 * F;
    const float* u = g + F;
    const float* d = dout + size_t(n) * F;
    float* dg = dgate_up + size_t(n) * 2 * F;
    float* du = dg + F;
    for (int j = 0; j < F; ++j) {
      const float sg = sigmoid(g[j]);
      // silu'(g) = σ(g)·(1 + g·(1 − σ(g))).
      dg[j] += d[j] * u[j] * (sg * (1.0f + g[j] * (1.0f - sg)));
      du[j] += d[j] * (g[j] * sg);
    }
  }
}

void rope_forward(int nt, float* qkv, int B, int T, int NH, int HS, float theta) {
  rope_apply(nt, qkv, B, T, NH, HS, theta, 1.0f);
}

void rope_backward(int nt, float* dqkv, int B, int T, int NH, int HS, float theta) {
  // A rotation's inverse is its transpose: the gradient goes back through the angle's negative.
  rope_apply(nt, dqkv, B, T, NH, HS, theta, -1.0f);
}

}  // namespace keel::cpu
