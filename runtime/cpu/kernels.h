// The CPU backend's kernels (fp32, layouts as llm.c's train_gpt2.c). Internal to runtime/cpu:
// the public surface is keel::Backend. Every kernel takes the thread count `nt` and
// parallelises with OpenMP static schedules only, so that for a given nt every output element
// is computed by the same thread in the same order on every run: results are bitwise
// repeatable. Reductions over rows (dbias, LayerNorm dweight/dbias, embedding gradients) are
// parallelised over columns instead, each column summed over rows in ascending order.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "runtime/backend.h"
#include "runtime/cpu/adamw_math.h"

namespace keel::cpu {

// C[M,N] = alpha·op(A)·op(B) + beta·C, row-major, with the M rows split over nt OpenMP
// threads that each call a single-threaded OpenBLAS sgemm. So one thread pool (OpenMP) serves
// every kernel: on Debian's openblas-pthread, sgemm called from inside an OpenMP loop with
// OpenBLAS's own threads on runs slower than with them off, and on the GPT shapes this row
// split matches or beats OpenBLAS's own threading. Must not be called from inside a parallel
// region.
void gemm(int nt, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc);
// The same on the calling thread only, for kernels that parallelise over independent GEMMs.
void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc);
// Makes OpenBLAS single-threaded (see gemm); cheap when it already is.
void blas_single_threaded();

// Elementwise (elementwise.cc).
void fill(int nt, float* x, size_t n, float value);
void add(int nt, float* out, const float* a, const float* b, size_t n);
void scale(int nt, float* x, size_t n, float s);
// Σ x and Σ x² in double over fixed 4096-element blocks whose partials are added in order,
// so the result is the same for every thread count.
double sum(int nt, const float* x, size_t n);
double sum_squares(int nt, const float* x, size_t n);
void gelu_forward(int nt, float* out, const float* inp, size_t n);
void gelu_backward(int nt, float* dinp, const float* inp, const float* dout, size_t n);
void embedding_forward(int nt, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end);
void embedding_backward(int nt, float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int B, int T, int C, int vocab_begin, int vocab_end);

// AdamW (adamw.cc).
void adamw(int nt, float* param, const float* grad, float* m, float* v, size_t n,
           const AdamWParams& p);
// adamw_element over elements [0, n) of each array on the calling thread, vectorised; the
// outputs may be the inputs. For kernels that split the work themselves.
void adamw_span(const AdamWConstants& c, float wd, const float* param, const float* grad,
                const float* m, const float* v, float* param_out, float* m_out, float* v_out,
                size_t n);

// Out-of-place AdamW with block hashes, and block hashing (adamw_update.cc); semantics as on
// keel::Backend.
void adamw_update(int nt, const AdamWUpdate& u, const AdamWParams& p);
void hash_blocks(int nt, const float* x, size_t n, uint64_t* out);

// LayerNorm (layernorm.cc).
void layernorm_forward(int nt, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
void layernorm_backward(int nt, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// Linear layers (matmul.cc).
void matmul_forward(int nt, float* out, const float* inp, const float* weight, const float* bias,
                    int N, int C, int OC);
// dinp, dweight and dbias may each be nullptr to skip that gradient.
void matmul_backward(int nt, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC);

// Causal self-attention (attention.cc).
void attention_forward(int nt, float* out, float* att, const float* qkv, int B, int T, int NH,
                       int HS);
void attention_backward(int nt, float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int NH, int HS);

// Llama kernels (llama_kernels.cc); semantics as keel_ops in model/plugin.h.
void rmsnorm_forward(int nt, float* out, float* rstd, const float* inp, const float* weight, int N,
                     int C);
void rmsnorm_backward(int nt, float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);
void swiglu_forward(int nt, float* out, const float* gate_up, int N, int F);
void swiglu_backward(int nt, float* dgate_up, const float* gate_up, const float* dout, int N,
                     int F);
void rope_forward(int nt, float* qkv, int B, int T, int NH, int HS, float theta);
void rope_backward(int nt, float* dqkv, int B, int T, int NH, int HS, float theta);

// Vocab-parallel cross-entropy (cross_entropy.cc); semantics as on keel::Backend.
void xent_row_max(int nt, float* row_max, const float* logits, int N, int V_local, int vocab_begin,
                  int vocab_size);
void xent_sum_exp(int nt, float* sum_exp, float* target_logit, const float* logits,
                  const float* row_max, const int32_t* targets, int N, int V_local, int vocab_begin,
                  int vocab_size);
void xent_finish(int nt, float* losses, float* dlogits, const float* logits, const float* row_max,
                 const float* sum_exp, const float* target_logit, const int32_t* targets, int N,
                 int V_local, int vocab_begin, int vocab_size, float loss_scale);

// exp(x) for float x to about 2 ulp (Cephes' expf polynomial). glibc's expf is an opaque call
// that GCC will not vectorise without -ffast-math, and softmax, GELU and cross-entropy spend
// most of their time in exp; this inline version is plain arithmetic, so loops over it
// vectorise while staying deterministic. Returns 0 below -87.3 and saturates at exp(88).
inline float exp_approx(float x) {
  constexpr float kLo = -87.3f, kHi = 88.0f;  // 2^n below stays a normal float
  // The clamps are bit masks rather than ?: because GCC turns chained float selects into
  // branches, and with -ftrapping-math (the default) a branch on a float compare stops the
  // loop from vectorising.
  const int32_t below = -static_cast<int32_t>(x < kLo);  // all ones or zero
  const int32_t above = -static_cast<int32_t>(x > kHi);
  const float xc = std::bit_cast<float>((std::bit_cast<int32_t>(x) & ~(below | above)) |
                                        (std::bit_cast<int32_t>(kLo) & below) |
                                        (std::bit_cast<int32_t>(kHi) & above));
  // Round x·log2(e) to the nearest integer with the 1.5·2^23 trick (exact for |n| < 2^22).
  constexpr float kMagic = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + kMagic) - kMagic;
  // r = x − n·ln2 in two pieces so that r keeps full precision.
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float y = p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return std::bit_cast<float>(std::bit_cast<int32_t>(y) & ~below);  // 0 below kLo
}

// Sums, dot products and maxima over short rows (softmax, LayerNorm) in eight interleaved
// lanes combined in a fixed order: the same bits every run, and, unlike one sequential
// accumulator, something GCC can vectorise without -ffast-math.
inline float lane_sum(const float* x, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += x[i + l];
  }
  for (; i < n; ++i) acc[i & 7] += x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
inline float lane_dot(const float* x, const float* y, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += x[i + l] * y[i + l];
  }
  for (; i < n; ++i) acc[i & 7] += x[i] * y[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
// Max of x[0..n), n >= 1 (NaNs are not propagated reliably).
inline float lane_max(const float* x, int n) {
  float acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = x[0];
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  }
  for (; i < n; ++i) acc[i & 7] = x[i] > acc[i & 7] ? x[i] : acc[i & 7];
  float m = acc[0];
  for (int l = 1; l < 8; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

// On a function holding elementwise or row loops: a second copy built for AVX-512
// (x86-64-v4), picked at load time where the CPU has it, runs them at twice the width. The
// build targets AVX2 (x86-64-v3) so that keel runs on any recent x86. The files that use it are
// compiled with -ffp-contract=off (runtime/CMakeLists.txt): GCC fuses a·b + c into one FMA in
// some loops at one width and not at the other, and without fusing (and without -ffast-math)
// each copy does exactly the IEEE operations of the source in its order, so both give the same
// bits and a run's result does not depend on which copy a machine picks. OpenMP regions are
// outlined before cloning, so the attribute goes on a function that a parallel region calls,
// not on one that contains it.
#define KEEL_WIDE_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))

// Thread tid's share [begin, end) of n items split evenly over nt threads.
inline void static_range(size_t n, int nt, int tid, size_t* begin, size_t* end) {
  *begin = n * static_cast<size_t>(tid) / static_cast<size_t>(nt);
  *end = n * static_cast<size_t>(tid + 1) / static_cast<size_t>(nt);
}

}  // namespace keel::cpu
