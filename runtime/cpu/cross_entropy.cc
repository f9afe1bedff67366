// Vocab-parallel softmax cross-entropy in three passes (see keel::Backend): each pass reads
// only this rank's vocabulary columns, and the runtime all-reduces row_max (max) and
// sum_exp / target_logit (sum) over TP between them. Columns whose global index is
// >= vocab_size are padding: left out of max and sum, and given gradient 0.
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/check.h"
#include "runtime/cpu/kernels.h"

namespace keel::cpu {

namespace {
// Number of this rank's columns that are real tokens.
int valid_columns(int V_local, int vocab_begin, int vocab_size) {
  return std::clamp(vocab_size - vocab_begin, 0, V_local);
}

// Σ exp(x[j] − max) in double lanes; exp in float so that the loop vectorises.
double sum_exp_row(const float* x, int n, float max) {
  double acc[8] = {};
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += exp_approx(x[j + l] - max);
  }
  for (; j < n; ++j) acc[j & 7] += exp_approx(x[j] - max);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
}  // namespace

void xent_row_max(int nt, float* row_max, const float* logits, int N, int V_local, int vocab_begin,
                  int vocab_size) {
  const int nv = valid_columns(V_local, vocab_begin, vocab_size);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < N; ++i) {
    row_max[i] = nv > 0 ? lane_max(logits + static_cast<size_t>(i) * V_local, nv)
                        : -std::numeric_limits<float>::infinity();
  }
}

void xent_sum_exp(int nt, float* sum_exp, float* target_logit, const float* logits,
                  const float* row_max, const int32_t* targets, int N, int V_local, int vocab_begin,
                  int vocab_size) {
  for (int i = 0; i < N; ++i) {
    KEEL_CHECK(targets[i] >= 0 && targets[i] < vocab_size, "target ", targets[i], " of row ", i,
               " is outside the vocabulary [0, ", vocab_size, ")");
  }
  const int nv = valid_columns(V_local, vocab_begin, vocab_size);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* row = logits + static_cast<size_t>(i) * V_local;
    sum_exp[i] = static_cast<float>(sum_exp_row(row, nv, row_max[i]));
    const int local = targets[i] - vocab_begin;
    target_logit[i] = local >= 0 && local < nv ? row[local] : 0.0f;
  }
}

void xent_finish(int nt, float* losses, float* dlogits, const float* logits, const float* row_max,
                 const float* sum_exp, const float* target_logit, const int32_t* targets, int N,
                 int V_local, int vocab_begin, int vocab_size, float loss_scale) {
  const int nv = valid_columns(V_local, vocab_begin, vocab_size);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < N; ++i) {
    const float max = row_max[i];
    losses[i] = std::log(sum_exp[i]) + max - target_logit[i];
    if (dlogits == nullptr) continue;
    const float* row = logits + static_cast<size_t>(i) * V_local;
    float* drow = dlogits + static_cast<size_t>(i) * V_local;
    const float scaled_inv_sum = loss_scale / sum_exp[i];
    // dlogits may alias logits. Going through a local buffer keeps the loop vectorised (no
    // runtime alias check falling back to scalar code) and gives the same bits either way.
    constexpr int kChunk = 256;
    float buf[kChunk];
    for (int j0 = 0; j0 < nv; j0 += kChunk) {
      const int len = std::min(kChunk, nv - j0);
      for (int j = 0; j < len; ++j) buf[j] = exp_approx(row[j0 + j] - max) * scaled_inv_sum;
      std::copy_n(buf, len, drow + j0);
    }
    std::fill(drow + nv, drow + V_local, 0.0f);
    const int local = targets[i] - vocab_begin;
    if (local >= 0 && local < nv) drow[local] -= loss_scale;
  }
}

}  // namespace keel::cpu
