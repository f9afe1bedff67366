// Linear layers on OpenBLAS. Layouts as llm.c: weight is [OC, C], so forward is
// out = inp·weightᵀ. All three GEMMs split their output rows over the OpenMP threads (see
// gemm in kernels.h), so no output element is reduced across threads and the result for a
// given thread count never depends on timing.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "runtime/cpu/kernels.h"

namespace keel::cpu {

void blas_single_threaded() {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(int nt, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  blas_single_threaded();
  // Row blocks are multiples of 16 so that every thread's slice starts on the BLAS kernel's
  // register-tile boundary; tiny problems stay on one thread.
  constexpr int kAlign = 16;
  int blocks = (M + kAlign - 1) / kAlign;
  int threads = std::min(nt, blocks);
  if (threads <= 1 || static_cast<double>(M) * N * K < 1e6) {
    gemm_serial(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    size_t b0, b1;
    static_range(blocks, omp_get_num_threads(), omp_get_thread_num(), &b0, &b1);
    int r0 = static_cast<int>(b0) * kAlign;
    int r1 = std::min(M, static_cast<int>(b1) * kAlign);
    // Row r of op(A) starts at A + r·lda untransposed, at column r (A + r) transposed.
    const float* a = trans_a ? A + r0 : A + static_cast<size_t>(r0) * lda;
    gemm_serial(trans_a, trans_b, r1 - r0, N, K, alpha, a, lda, B, ldb, beta,
                C + static_cast<size_t>(r0) * ldc, ldc);
  }
}

void matmul_forward(int nt, float* out, const float* inp, const float* weight, const float* bias,
                    int N, int C, int OC) {
  if (bias != nullptr) {
    // Seed out with the bias and let the GEMM accumulate onto it (beta = 1).
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + static_cast<size_t>(n) * OC);
  }
  gemm(nt, false, true, N, OC, C, 1.0f, inp, C, weight, C, bias != nullptr ? 1.0f : 0.0f, out, OC);
}

void matmul_backward(int nt, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
  // dinp[N,C] += dout[N,OC]·weight[OC,C]
  if (dinp != nullptr) gemm(nt, false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
  // dweight[OC,C] += doutᵀ·inp: split over OC, each element reduced over N inside one GEMM.
  if (dweight != nullptr) {
    gemm(nt, true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  }
  if (dbias != nullptr) {
    // Columns split over threads, rows summed in ascending order.
#pragma omp parallel num_threads(nt)
    {
      size_t o0, o1;
      static_range(OC, omp_get_num_threads(), omp_get_thread_num(), &o0, &o1);
      for (int n = 0; n < N; ++n) {
        const float* row = dout + static_cast<size_t>(n) * OC;
        for (size_t o = o0; o < o1; ++o) dbias[o] += row[o];
      }
    }
  }
}

}  // namespace keel::cpu
