// keel::Backend on the host: 64-byte aligned heap memory, kernels from runtime/cpu/*.cc.
// The backend owns its thread count; every kernel gets it explicitly (OpenMP num_threads
// clauses), so two CPU backends with different counts can live in one process (the tests
// compare them) without fighting over omp_set_num_threads.
#include <omp.h>

#include <cstdlib>
#include <cstring>

#include "runtime/backend.h"
#include "runtime/check.h"
#include "runtime/cpu/kept_blocks.h"
#include "runtime/cpu/kernels.h"

namespace keel {

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads) : nt_(num_threads > 0 ? num_threads : omp_get_num_procs()) {
    // Parallelism comes from OpenMP; OpenBLAS runs single-threaded inside it (kernels.h).
    omp_set_num_threads(nt_);
    cpu::blas_single_threaded();
  }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override {
    return "cpu (" + std::to_string(nt_) + (nt_ == 1 ? " thread)" : " threads)");
  }

  void* alloc(size_t bytes) override {
    constexpr size_t kAlign = 64;
    size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded == 0) rounded = kAlign;  // a distinct pointer even for zero bytes
    void* p = kept_.take(rounded);       // zero-filled already
    if (p == nullptr) {
      p = std::aligned_alloc(kAlign, rounded);
      KEEL_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
      std::memset(p, 0, rounded);
    }
    kept_.note(p, rounded);
    return p;
  }
  void free(void* p) override {
    if (!kept_.keep(p)) std::free(p);
  }
  bool keep_freed_blocks(bool on) override {
    kept_.set_keeping(on);
    return true;
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    std::memmove(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    std::memmove(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void synchronize() override {}

  void fill(float* x, size_t n, float value) override { cpu::fill(nt_, x, n, value); }
  void add(float* out, const float* a, const float* b, size_t n) override {
    cpu::add(nt_, out, a, b, n);
  }
  void scale(float* x, size_t n, float s) override { cpu::scale(nt_, x, n, s); }
  double sum(const float* x, size_t n) override { return cpu::sum(nt_, x, n); }
  double sum_squares(const float* x, size_t n) override { return cpu::sum_squares(nt_, x, n); }

  void adamw(float* param, const float* grad, float* m, float* v, size_t n,
             const AdamWParams& p) override {
    cpu::adamw(nt_, param, grad, m, v, n, p);
  }
  bool updates_out_of_place() const override { return true; }
  void adamw_update(const AdamWUpdate& u, const AdamWParams& p) override {
    cpu::adamw_update(nt_, u, p);
  }
  void hash_blocks(const float* x, size_t n, uint64_t* out) override {
    cpu::hash_blocks(nt_, x, n, out);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int B, int T, int C, int vocab_begin, int vocab_end) override {
    cpu::embedding_forward(nt_, out, tokens, wte, wpe, B, T, C, vocab_begin, vocab_end);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                          int T, int C, int vocab_begin, int vocab_end) override {
    cpu::embedding_backward(nt_, dwte, dwpe, dout, tokens, B, T, C, vocab_begin, vocab_end);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    cpu::layernorm_forward(nt_, out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    cpu::layernorm_backward(nt_, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override {
    cpu::matmul_forward(nt_, out, inp, weight, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override {
    cpu::matmul_backward(nt_, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH,
                         int HS) override {
    cpu::attention_forward(nt_, out, att, qkv, B, T, NH, HS);
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* att, int B, int T, int NH, int HS) override {
    cpu::attention_backward(nt_, dqkv, scratch, dout, qkv, att, B, T, NH, HS);
  }
  void gelu_forward(float* out, const float* inp, size_t n) override {
    cpu::gelu_forward(nt_, out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    cpu::gelu_backward(nt_, dinp, inp, dout, n);
  }

  void xent_row_max(float* row_max, const float* logits, int N, int V_local, int vocab_begin,
                    int vocab_size) override {
    cpu::xent_row_max(nt_, row_max, logits, N, V_local, vocab_begin, vocab_size);
  }
  void xent_sum_exp(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                    const int32_t* targets, int N, int V_local, int vocab_begin,
                    int vocab_size) override {
    cpu::xent_sum_exp(nt_, sum_exp, target_logit, logits, row_max, targets, N, V_local, vocab_begin,
                      vocab_size);
  }
  void xent_finish(float* losses, float* dlogits, const float* logits, const float* row_max,
                   const float* sum_exp, const float* target_logit, const int32_t* targets, int N,
                   int V_local, int vocab_begin, int vocab_size, float loss_scale) override {
    cpu::xent_finish(nt_, losses, dlogits, logits, row_max, sum_exp, target_logit, targets, N,
                     V_local, vocab_begin, vocab_size, loss_scale);
  }

  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                       int C) override {
    cpu::rmsnorm_forward(nt_, out, rstd, inp, weight, N, C);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rstd, int N, int C) override {
    cpu::rmsnorm_backward(nt_, dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void swiglu_forward(float* out, const float* gate_up, int N, int F) override {
    cpu::swiglu_forward(nt_, out, gate_up, N, F);
  }
  void swiglu_backward(float* dgate_up, const float* gate_up, const float* dout, int N,
                       int F) override {
    cpu::swiglu_backward(nt_, dgate_up, gate_up, dout, N, F);
  }
  void rope_forward(float* qkv, int B, int T, int NH, int HS, float theta) override {
    cpu::rope_forward(nt_, qkv, B, T, NH, HS, theta);
  }
  void rope_backward(float* dqkv, int B, int T, int NH, int HS, float theta) override {
    cpu::rope_backward(nt_, dqkv, B, T, NH, HS, theta);
  }

 private:
  const int nt_;
  cpu::KeptBlocks kept_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace keel
