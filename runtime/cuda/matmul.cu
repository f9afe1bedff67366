// Linear layers on cuBLAS: out[N,OC] = inp[N,C]·weight[OC,C]ᵀ + bias, and its backward.
//
// cuBLAS is column-major; a row-major [R, K] matrix is a column-major [K, R] one, so every
// product is written as its transpose (the same mapping as llm.c's matmul_forward).
//
// Precision: kFp32 runs true fp32 GEMMs (CUBLAS_COMPUTE_32F, no TF32). kBf16 converts both
// operands into backend-owned bf16 buffers and runs cublasGemmEx with fp32 accumulation and
// fp32 output, so the tensor cores do the work while master weights, activations and
// gradients stay fp32. The weight is converted on every call: it changes every step, and a
// cache keyed on a pointer could not tell.
//
// Determinism: cuBLAS GEMMs give the same bits for the same shapes, handle, stream and
// workspace (the backend pins a fixed workspace and disallows atomics). The bias gradient is a
// column sum and goes through column_sums_accumulate (common.cuh) instead of atomics.
#include "runtime/cuda/common.cuh"
#include "runtime/cuda/kernels.h"

namespace keel::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void add_bias_kernel(float* __restrict__ out, const float* __restrict__ bias, size_t N,
                                int OC) {
  const size_t total = N * OC;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] += bias[i % OC];
  }
}

struct RowsOf {
  const float* x;
  int cols;
  __device__ ColumnValues<1> operator()(int row, int col) const {
    return {{x[static_cast<size_t>(row) * cols + col]}};
  }
};

// In kBf16 mode, a bf16 copy of x in `slot`; else x itself.
const void* gemm_operand(Context& ctx, const float* x, size_t n, Slot slot) {
  if (ctx.precision != Precision::kBf16) return x;
  auto* copy = ctx.scratch.get<__nv_bfloat16>(slot, n);
  to_bf16(ctx, copy, x, n);
  return copy;
}

}  // namespace

void gemm_strided_batched(Context& ctx, bool trans_a, bool trans_b, int m, int n, int k,
                          float alpha, const void* A, int lda, long long stride_a, const void* B,
                          int ldb, long long stride_b, float beta, float* C, int ldc,
                          long long stride_c, int batch, bool bf16) {
  if (m <= 0 || n <= 0 || batch <= 0) return;
  const cudaDataType_t ab_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    KEEL_CHECK_CUBLAS(cublasGemmEx(ctx.cublas, op_a, op_b, m, n, k, &alpha, A, ab_type, lda, B,
                                   ab_type, ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
  } else {
    KEEL_CHECK_CUBLAS(cublasGemmStridedBatchedEx(ctx.cublas, op_a, op_b, m, n, k, &alpha, A,
                                                 ab_type, lda, stride_a, B, ab_type, ldb, stride_b,
                                                 &beta, C, CUDA_R_32F, ldc, stride_c, batch,
                                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

void matmul_forward(Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  const bool bf16 = ctx.precision == Precision::kBf16;
  const void* w = gemm_operand(ctx, weight, static_cast<size_t>(OC) * C, Slot::kOperandA);
  const void* x = gemm_operand(ctx, inp, static_cast<size_t>(N) * C, Slot::kOperandB);
  // outᵀ[OC, N] = weight[OC, C]·inpᵀ[C, N]  (column-major: op(W)=Wᵀ of the [C, OC] view)
  gemm_strided_batched(ctx, true, false, OC, N, C, 1.0f, w, C, 0, x, C, 0, 0.0f, out, OC, 0, 1,
                       bf16);
  if (bias != nullptr) {
    const size_t total = static_cast<size_t>(N) * OC;
    add_bias_kernel<<<grid_for(total, kBlock), kBlock, 0, ctx.stream>>>(out, bias, N, OC);
    KEEL_CHECK_LAUNCH();
  }
}

void matmul_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
  if (N <= 0 || C <= 0 || OC <= 0) return;
  const bool bf16 = ctx.precision == Precision::kBf16;
  const void* g = gemm_operand(ctx, dout, static_cast<size_t>(N) * OC, Slot::kOperandC);
  if (dinp != nullptr) {
    const void* w = gemm_operand(ctx, weight, static_cast<size_t>(OC) * C, Slot::kOperandA);
    // dinpᵀ[C, N] += weightᵀ[C, OC]·doutᵀ[OC, N]
    gemm_strided_batched(ctx, false, false, C, N, OC, 1.0f, w, C, 0, g, OC, 0, 1.0f, dinp, C, 0, 1,
                         bf16);
  }
  if (dweight != nullptr) {
    const void* x = gemm_operand(ctx, inp, static_cast<size_t>(N) * C, Slot::kOperandB);
    // dweightᵀ[C, OC] += inpᵀ[C, N]·dout[N, OC]
    gemm_strided_batched(ctx, false, true, C, OC, N, 1.0f, x, C, 0, g, OC, 0, 1.0f, dweight, C, 0,
                         1, bf16);
  }
  if (dbias != nullptr) {
    column_sums_accumulate<1>(ctx, ColumnOutputs<1>{{dbias}}, N, OC, RowsOf{dout, OC});
  }
}

}  // namespace keel::cuda
