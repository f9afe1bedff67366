// LayerNorm over the last dimension (eps 1e-5), as llm.c's layernorm_forward/backward.
// Row statistics are per-row work, split over rows; dweight and dbias reduce over rows, so
// they run in a second pass split over columns, each column summed in ascending row order.
#include <omp.h>

#include <cmath>

#include "runtime/cpu/kernels.h"

namespace keel::cpu {

namespace {
constexpr float kEps = 1e-5f;

// Σ (x − m)² in eight lanes, like lane_sum.
float centered_sum_squares(const float* x, float m, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      float d = x[i + l] - m;
      acc[l] += d * d;
    }
  }
  for (; i < n; ++i) {
    float d = x[i] - m;
    acc[i & 7] += d * d;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// One row of the forward: out, and the row's mean and 1/std.
KEEL_WIDE_CLONES void layernorm_forward_row(float* o, float* mean, float* rstd, const float* x,
                                            const float* weight, const float* bias, int C) {
  const float m = lane_sum(x, C) / static_cast<float>(C);
  const float var = centered_sum_squares(x, m, C) / static_cast<float>(C);
  const float s = 1.0f / std::sqrt(var + kEps);
  for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * weight[i] + bias[i];
  *mean = m;
  *rstd = s;
}

// One row of the backward's first pass: di += (w·d − mean(w·d) − norm·mean(w·d·norm))·rstd.
KEEL_WIDE_CLONES void layernorm_backward_row(float* di, const float* d, const float* x,
                                             const float* weight, float m, float s, int C) {
  float acc_a[8] = {}, acc_b[8] = {};
  int i = 0;
  for (; i + 8 <= C; i += 8) {
    for (int l = 0; l < 8; ++l) {
      float dnorm = weight[i + l] * d[i + l];
      acc_a[l] += dnorm;
      acc_b[l] += dnorm * ((x[i + l] - m) * s);
    }
  }
  for (; i < C; ++i) {
    float dnorm = weight[i] * d[i];
    acc_a[i & 7] += dnorm;
    acc_b[i & 7] += dnorm * ((x[i] - m) * s);
  }
  float sa = 0.0f, sb = 0.0f;
  for (int l = 0; l < 8; ++l) {
    sa += acc_a[l];
    sb += acc_b[l];
  }
  const float dnorm_mean = sa / static_cast<float>(C);
  const float dnorm_norm_mean = sb / static_cast<float>(C);
  for (int j = 0; j < C; ++j) {
    float norm = (x[j] - m) * s;
    di[j] += (weight[j] * d[j] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}
}  // namespace

void layernorm_forward(int nt, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t at = static_cast<size_t>(n) * C;
    layernorm_forward_row(out + at, &mean[n], &rstd[n], inp + at, weight, bias, C);
  }
}

void layernorm_backward(int nt, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
#pragma omp parallel num_threads(nt)
  {
    // Pass 1, rows: dinp += (w·dout − mean(w·dout) − norm·mean(w·dout·norm))·rstd.
#pragma omp for schedule(static) nowait
    for (int n = 0; n < N; ++n) {
      const size_t at = static_cast<size_t>(n) * C;
      layernorm_backward_row(dinp + at, dout + at, inp + at, weight, mean[n], rstd[n], C);
    }
    // Pass 2, columns. No barrier between the passes: they write different arrays and read
    // only inputs.
    size_t c0, c1;
    static_range(C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<size_t>(n) * C;
      const float* d = dout + static_cast<size_t>(n) * C;
      const float m = mean[n], s = rstd[n];
      for (size_t j = c0; j < c1; ++j) {
        dbias[j] += d[j];
        dweight[j] += d[j] * ((x[j] - m) * s);
      }
    }
  }
}

}  // namespace keel::cpu
