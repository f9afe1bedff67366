// Elementwise kernels, fixed-order reductions, GELU and the token/position embedding.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/cpu/kernels.h"

namespace keel::cpu {

namespace {
// Below this many elements a parallel region costs more than it saves.
constexpr size_t kParallelMin = 1 << 15;
// Reduction block: fixed, so sums do not depend on the thread count.
constexpr size_t kSumBlock = 4096;

// Σ f(x[i]) over one block in double, in four interleaved lanes combined in a fixed order.
template <bool kSquare>
double block_sum(const float* x, size_t n) {
  double acc[4] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int l = 0; l < 4; ++l) {
      double v = x[i + l];
      acc[l] += kSquare ? v * v : v;
    }
  }
  for (; i < n; ++i) {
    double v = x[i];
    acc[i & 3] += kSquare ? v * v : v;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

template <bool kSquare>
double blocked_sum(int nt, const float* x, size_t n) {
  const size_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> partial(blocks);
#pragma omp parallel for num_threads(nt) schedule(static) if (n >= kParallelMin)
  for (size_t b = 0; b < blocks; ++b) {
    size_t begin = b * kSumBlock;
    partial[b] = block_sum<kSquare>(x + begin, std::min(kSumBlock, n - begin));
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

// tanh through exp_approx, so that GELU loops vectorise (see exp_approx).
inline float tanh_approx(float u) {
  return 1.0f - 2.0f / (exp_approx(2.0f * u) + 1.0f);
}
}  // namespace

void fill(int nt, float* x, size_t n, float value) {
  // Zeroing (gradients, every step) goes to memset, whose wide stores beat the loop's.
  const bool zero = std::bit_cast<uint32_t>(value) == 0;
#pragma omp parallel num_threads(nt) if (n >= kParallelMin)
  {
    size_t b, e;
    static_range(n, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
    if (zero) {
      std::memset(x + b, 0, (e - b) * sizeof(float));
    } else {
      for (size_t i = b; i < e; ++i) x[i] = value;
    }
  }
}

void add(int nt, float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for num_threads(nt) schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void scale(int nt, float* x, size_t n, float s) {
#pragma omp parallel for num_threads(nt) schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

double sum(int nt, const float* x, size_t n) {
  return blocked_sum<false>(nt, x, n);
}
double sum_squares(int nt, const float* x, size_t n) {
  return blocked_sum<true>(nt, x, n);
}

namespace {
KEEL_WIDE_CLONES void gelu_forward_span(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanh_approx(kGeluScale * (x + cube)));
  }
}

KEEL_WIDE_CLONES void gelu_backward_span(float* dinp, const float* inp, const float* dout,
                                         size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    float tanh_out = tanh_approx(kGeluScale * (x + cube));
    float sech2 = 1.0f - tanh_out * tanh_out;
    float local_grad = 0.5f * (1.0f + tanh_out) +
                       x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local_grad * dout[i];
  }
}
}  // namespace

void gelu_forward(int nt, float* out, const float* inp, size_t n) {
#pragma omp parallel num_threads(nt) if (n >= kParallelMin)
  {
    size_t b, e;
    static_range(n, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
    gelu_forward_span(out + b, inp + b, e - b);
  }
}

void gelu_backward(int nt, float* dinp, const float* inp, const float* dout, size_t n) {
#pragma omp parallel num_threads(nt) if (n >= kParallelMin)
  {
    size_t b, e;
    static_range(n, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
    gelu_backward_span(dinp + b, inp + b, dout + b, e - b);
  }
}

void embedding_forward(int nt, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int bt = 0; bt < B * T; ++bt) {
    float* o = out + static_cast<size_t>(bt) * C;
    const int tok = tokens[bt];
    if (tok >= vocab_begin && tok < vocab_end) {
      std::copy_n(wte + static_cast<size_t>(tok - vocab_begin) * C, C, o);
    } else {
      std::fill_n(o, C, 0.0f);
    }
    if (wpe != nullptr) {
      const float* p = wpe + static_cast<size_t>(bt % T) * C;
      for (int i = 0; i < C; ++i) o[i] += p[i];
    }
  }
}

void embedding_backward(int nt, float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C, int vocab_begin, int vocab_end) {
  // A token may repeat anywhere in the batch, so rows of dwte are not owned by one position:
  // split the channels over threads instead and visit positions in order.
#pragma omp parallel num_threads(nt)
  {
    size_t c0, c1;
    static_range(C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
    for (int bt = 0; bt < B * T; ++bt) {
      const float* d = dout + static_cast<size_t>(bt) * C;
      const int tok = tokens[bt];
      if (dwte != nullptr && tok >= vocab_begin && tok < vocab_end) {
        float* w = dwte + static_cast<size_t>(tok - vocab_begin) * C;
        for (size_t i = c0; i < c1; ++i) w[i] += d[i];
      }
      if (dwpe != nullptr) {
        float* p = dwpe + static_cast<size_t>(bt % T) * C;
        for (size_t i = c0; i < c1; ++i) p[i] += d[i];
      }
    }
  }
}

}  // namespace keel::cpu
