// Host-side launchers of the CUDA backend's kernels, one group per .cu file. Each queues its
// work on ctx.stream and returns without waiting, except where a comment says otherwise.
// Semantics (shapes, which outputs accumulate) are those of keel_ops in model/plugin.h and of
// Backend in runtime/backend.h; the .cu files say how and why the kernels are shaped.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "runtime/backend.h"
#include "runtime/cuda/context.h"

namespace keel::cuda {

// elementwise.cu
void fill(Context& ctx, float* x, size_t n, float value);
void add(Context& ctx, float* out, const float* a, const float* b, size_t n);
void scale(Context& ctx, float* x, size_t n, float s);
void to_bf16(Context& ctx, __nv_bfloat16* out, const float* in, size_t n);
// Σ x (or Σ x²) in double, in a fixed order; synchronizes the stream and returns on the host.
double reduce_sum(Context& ctx, const float* x, size_t n, bool squares);

// adamw.cu
void adamw(Context& ctx, float* param, const float* grad, float* m, float* v, size_t n,
           const AdamWParams& p);

// encoder.cu (embedding_backward synchronizes: it buckets the tokens on the host)
void embedding_forward(Context& ctx, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end);
void embedding_backward(Context& ctx, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int B, int T, int C, int vocab_begin, int vocab_end);

// layernorm.cu
void layernorm_forward(Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
void layernorm_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// matmul.cu
void matmul_forward(Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC);
void matmul_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC);
// C[batch] = alpha·op(A)·op(B) + beta·C in cuBLAS's column-major convention, batched with
// fixed strides. A and B are float, or __nv_bfloat16 when `bf16` (the caller converted them);
// C is always float and accumulation is fp32.
void gemm_strided_batched(Context& ctx, bool trans_a, bool trans_b, int m, int n, int k,
                          float alpha, const void* A, int lda, long long stride_a, const void* B,
                          int ldb, long long stride_b, float beta, float* C, int ldc,
                          long long stride_c, int batch, bool bf16);

// attention.cu
void attention_forward(Context& ctx, float* out, float* att, const float* qkv, int B, int T, int NH,
                       int HS);
void attention_backward(Context& ctx, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* att, int B, int T, int NH, int HS);

// gelu.cu
void gelu_forward(Context& ctx, float* out, const float* inp, size_t n);
void gelu_backward(Context& ctx, float* dinp, const float* inp, const float* dout, size_t n);

// cross_entropy.cu
void xent_row_max(Context& ctx, float* row_max, const float* logits, int N, int V_local,
                  int vocab_begin, int vocab_size);
void xent_sum_exp(Context& ctx, float* sum_exp, float* target_logit, const float* logits,
                  const float* row_max, const int32_t* targets, int N, int V_local, int vocab_begin,
                  int vocab_size);
void xent_finish(Context& ctx, float* losses, float* dlogits, const float* logits,
                 const float* row_max, const float* sum_exp, const float* target_logit,
                 const int32_t* targets, int N, int V_local, int vocab_begin, int vocab_size,
                 float loss_scale);

}  // namespace keel::cuda
