// A Backend is one device's memory and kernels: the CPU (OpenBLAS + OpenMP) or one CUDA GPU
// (cuBLAS + runtime/cuda kernels). The Trainer allocates all state through it, and
// model/ops_table.h wraps it as the C keel_ops table that plugins compute with.
//
// Every pointer a Backend method takes is memory of that backend. Kernel semantics (shapes,
// which outputs accumulate) are those documented on keel_ops in model/plugin.h.
// Reductions run in a fixed order so that results never depend on thread timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/check.h"

namespace keel {

enum class DeviceKind { kCpu, kCuda };

// Precision of matmuls. kFp32 everywhere on CPU; on GPU, kBf16 runs GEMMs on bf16 copies
// of the operands with fp32 accumulation while master weights and optimizer stay fp32.
enum class Precision { kFp32, kBf16 };

struct AdamWParams {
  float lr = 0;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0;  // already 0 for parameters that are not decayed
  float grad_scale = 1;    // gradients are multiplied by this first (clipping)
  int64_t t = 1;           // 1-based step, for bias correction
};

// Where a weight decay applies in an out-of-place update: elements [begin, end) of the flat
// parameter buffer.
struct AdamWSegment {
  size_t begin = 0, end = 0;
  float weight_decay = 0;
};

// One AdamW step from one copy of the state into another (a state double-buffered in its
// snapshot slots, DESIGN.md Checkpoints), hashing each 64 KiB block it wrote
// (runtime/block_digest.h) while the block is in cache. Parameters and gradients are indexed
// by flat element; moments from `begin` (a ZeRO-1 shard starts there). Elements of [begin,
// end) outside every segment (alignment padding) are copied unchanged.
struct AdamWUpdate {
  const float* param = nullptr;
  const float* grad = nullptr;
  const float* m = nullptr;
  const float* v = nullptr;
  float* param_out = nullptr;
  float* m_out = nullptr;
  float* v_out = nullptr;
  size_t begin = 0, end = 0;               // begin a multiple of kDigestBlockFloats
  const AdamWSegment* segments = nullptr;  // sorted, disjoint, inside [begin, end)
  size_t num_segments = 0;
  // Block hashes: param_out's block i (flat index / kDigestBlockFloats) goes to
  // param_hashes[i]; the moments' blocks, counted from `begin`, to m_hashes and v_hashes.
  uint64_t* param_hashes = nullptr;
  uint64_t* m_hashes = nullptr;
  uint64_t* v_hashes = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // e.g. "cpu (2 threads)", "cuda:0 NVIDIA H200"

  // Memory. alloc returns 64-byte aligned memory, zero-filled; free(nullptr) is a no-op.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  // While on, large blocks that are freed are kept, their pages already faulted in, and
  // handed to the next alloc of the same size instead of new memory; off releases them. A
  // warm standby rehearses a rank's allocations with it (launcher/worker/standby.h), so that
  // the rank it becomes does not pay ~1 ms per 2 MB of page faults on the recovery's path.
  // Returns whether this backend keeps blocks; default: it does not (a device allocator is
  // not faulted in page by page).
  virtual bool keep_freed_blocks(bool on) {
    (void)on;
    return false;
  }
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  virtual void synchronize() = 0;  // waits for all queued work (no-op on CPU)

  // Elementwise.
  virtual void fill(float* x, size_t n, float value) = 0;
  virtual void add(float* out, const float* a, const float* b, size_t n) = 0;
  virtual void scale(float* x, size_t n, float s) = 0;

  // Reductions to the host, in a fixed order.
  virtual double sum(const float* x, size_t n) = 0;
  virtual double sum_squares(const float* x, size_t n) = 0;

  // One AdamW step on n contiguous parameters (PyTorch's AdamW with bias correction).
  virtual void adamw(float* param, const float* grad, float* m, float* v, size_t n,
                     const AdamWParams& p) = 0;
  // Whether adamw_update and hash_blocks work on this backend's memory (the CPU's host
  // memory); a state on a GPU is snapshotted by copying instead.
  virtual bool updates_out_of_place() const { return false; }
  // The same step as adamw() with `p.weight_decay` taken per segment (see AdamWUpdate).
  virtual void adamw_update(const AdamWUpdate&, const AdamWParams&) {
    throw Error("backend " + name() + " cannot update a state out of place");
  }
  // Hashes of the 64 KiB blocks of x[0, n) into out[0, ceil(n / kDigestBlockFloats)).
  virtual void hash_blocks(const float*, size_t, uint64_t*) {
    throw Error("backend " + name() + " cannot hash state blocks");
  }

  // GPT kernels; semantics as keel_ops in model/plugin.h.
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int B, int T, int C, int vocab_begin,
                                 int vocab_end) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int B, int T, int C, int vocab_begin,
                                  int vocab_end) = 0;
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                              int N, int C, int OC) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int N, int C, int OC) = 0;
  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH,
                                 int HS) = 0;
  virtual void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* att, int B, int T, int NH, int HS) = 0;
  virtual void gelu_forward(float* out, const float* inp, size_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) = 0;

  // Vocab-parallel cross-entropy in three passes, so the runtime can all-reduce over TP
  // between them (model/ops_table.cc). logits is [N, V_local] holding vocab columns
  // [vocab_begin, vocab_begin + V_local); columns >= vocab_size are excluded.
  // 1. row_max[i] = max over valid local columns (-inf if none).
  virtual void xent_row_max(float* row_max, const float* logits, int N, int V_local,
                            int vocab_begin, int vocab_size) = 0;
  // 2. given the global row_max: sum_exp[i] = Σ exp(logit − max) over valid local columns;
  //    target_logit[i] = logit of the target if it is local, else 0.
  virtual void xent_sum_exp(float* sum_exp, float* target_logit, const float* logits,
                            const float* row_max, const int32_t* targets, int N, int V_local,
                            int vocab_begin, int vocab_size) = 0;
  // 3. given global sum_exp and target_logit: losses[i] = log(sum_exp) + max − target_logit,
  //    and if dlogits != nullptr, dlogits = loss_scale·(softmax − onehot), 0 on padding.
  //    dlogits may alias logits (elementwise in place).
  virtual void xent_finish(float* losses, float* dlogits, const float* logits, const float* row_max,
                           const float* sum_exp, const float* target_logit, const int32_t* targets,
                           int N, int V_local, int vocab_begin, int vocab_size,
                           float loss_scale) = 0;

  // Llama kernels (keel_ops version 3); semantics as keel_ops in model/plugin.h. A backend
  // without them refuses by name, so a plugin that needs them fails at its first call.
  virtual void rmsnorm_forward(float*, float*, const float*, const float*, int, int) {
    unsupported("rmsnorm_forward");
  }
  virtual void rmsnorm_backward(float*, float*, const float*, const float*, const float*,
                                const float*, int, int) {
    unsupported("rmsnorm_backward");
  }
  virtual void swiglu_forward(float*, const float*, int, int) { unsupported("swiglu_forward"); }
  virtual void swiglu_backward(float*, const float*, const float*, int, int) {
    unsupported("swiglu_backward");
  }
  virtual void rope_forward(float*, int, int, int, int, float) { unsupported("rope_forward"); }
  virtual void rope_backward(float*, int, int, int, int, float) { unsupported("rope_backward"); }

 private:
  [[noreturn]] void unsupported(const char* op) const {
    throw Error(std::string(op) + " is not implemented on the " + name() + " backend yet");
  }
};

// The CPU backend; num_threads <= 0 means all cores. Always available.
std::unique_ptr<Backend> make_cpu_backend(int num_threads = 0);

// The CUDA backend on `device`; throws keel::Error when keel was built without CUDA or no
// GPU is present (see cuda_available()).
std::unique_ptr<Backend> make_cuda_backend(int device, Precision precision);
bool cuda_available();
// GPUs this process can see (0 without CUDA, a driver or a device).
int cuda_device_count();

}  // namespace keel
