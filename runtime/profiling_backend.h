// A Backend that forwards to another and adds up the wall time of each kernel family, for
// benchmarks that report the share of step time per kernel. It synchronizes after every
// call, so it perturbs GPU timings (no overlap) and is never used for training runs.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "runtime/backend.h"

namespace keel {

class ProfilingBackend : public Backend {
 public:
  explicit ProfilingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  // Seconds per kernel family ("matmul_forward", "attention_backward", ...).
  const std::map<std::string, double>& seconds() const { return seconds_; }
  void reset() { seconds_.clear(); }

  DeviceKind kind() const override { return inner_->kind(); }
  std::string name() const override { return inner_->name(); }
  void* alloc(size_t bytes) override { return inner_->alloc(bytes); }
  void free(void* p) override { inner_->free(p); }
  void copy_to_host(void* d, const void* s, size_t n) override { inner_->copy_to_host(d, s, n); }
  void copy_from_host(void* d, const void* s, size_t n) override {
    inner_->copy_from_host(d, s, n);
  }
  void copy(void* d, const void* s, size_t n) override {
    time("copy", [&] { inner_->copy(d, s, n); });
  }
  void synchronize() override { inner_->synchronize(); }
  void fill(float* x, size_t n, float v) override {
    time("fill", [&] { inner_->fill(x, n, v); });
  }
  void add(float* o, const float* a, const float* b, size_t n) override {
    time("residual_add", [&] { inner_->add(o, a, b, n); });
  }
  void scale(float* x, size_t n, float s) override {
    time("scale", [&] { inner_->scale(x, n, s); });
  }
  double sum(const float* x, size_t n) override {
    double r = 0;
    time("sum", [&] { r = inner_->sum(x, n); });
    return r;
  }
  double sum_squares(const float* x, size_t n) override {
    double r = 0;
    time("grad_norm", [&] { r = inner_->sum_squares(x, n); });
    return r;
  }
  void adamw(float* p, const float* g, float* m, float* v, size_t n,
             const AdamWParams& a) override {
    time("adamw", [&] { inner_->adamw(p, g, m, v, n, a); });
  }
  bool updates_out_of_place() const override { return inner_->updates_out_of_place(); }
  void adamw_update(const AdamWUpdate& u, const AdamWParams& a) override {
    time("adamw", [&] { inner_->adamw_update(u, a); });
  }
  void hash_blocks(const float* x, size_t n, uint64_t* out) override {
    time("hash_blocks", [&] { inner_->hash_blocks(x, n, out); });
  }
  void embedding_forward(float* out, const int32_t* tok, const float* wte, const float* wpe, int B,
                         int T, int C, int vb, int ve) override {
    time("embedding_forward",
         [&] { inner_->embedding_forward(out, tok, wte, wpe, B, T, C, vb, ve); });
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tok, int B,
                          int T, int C, int vb, int ve) override {
    time("embedding_backward",
         [&] { inner_->embedding_backward(dwte, dwpe, dout, tok, B, T, C, vb, ve); });
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override {
    time("layernorm_forward", [&] { inner_->layernorm_forward(out, mean, rstd, inp, w, b, N, C); });
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) override {
    time("layernorm_backward",
         [&] { inner_->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* b, int N, int C,
                      int OC) override {
    time("matmul_forward", [&] { inner_->matmul_forward(out, inp, w, b, N, C, OC); });
  }
  void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, int N, int C, int OC) override {
    time("matmul_backward", [&] { inner_->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC); });
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH,
                         int HS) override {
    time("attention_forward", [&] { inner_->attention_forward(out, att, qkv, B, T, NH, HS); });
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* att, int B, int T, int NH, int HS) override {
    time("attention_backward",
         [&] { inner_->attention_backward(dqkv, scratch, dout, qkv, att, B, T, NH, HS); });
  }
  void gelu_forward(float* out, const float* inp, size_t n) override {
    time("gelu_forward", [&] { inner_->gelu_forward(out, inp, n); });
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    time("gelu_backward", [&] { inner_->gelu_backward(dinp, inp, dout, n); });
  }
  void xent_row_max(float* mx, const float* logits, int N, int V, int vb, int vs) override {
    time("cross_entropy", [&] { inner_->xent_row_max(mx, logits, N, V, vb, vs); });
  }
  void xent_sum_exp(float* se, float* tl, const float* logits, const float* mx,
                    const int32_t* targets, int N, int V, int vb, int vs) override {
    time("cross_entropy", [&] { inner_->xent_sum_exp(se, tl, logits, mx, targets, N, V, vb, vs); });
  }
  void xent_finish(float* losses, float* dlogits, const float* logits, const float* mx,
                   const float* se, const float* tl, const int32_t* targets, int N, int V, int vb,
                   int vs, float scale) override {
    time("cross_entropy", [&] {
      inner_->xent_finish(losses, dlogits, logits, mx, se, tl, targets, N, V, vb, vs, scale);
    });
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                       int C) override {
    time("rmsnorm_forward", [&] { inner_->rmsnorm_forward(out, rstd, inp, w, N, C); });
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                        const float* rstd, int N, int C) override {
    time("rmsnorm_backward", [&] { inner_->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); });
  }
  void swiglu_forward(float* out, const float* gu, int N, int F) override {
    time("swiglu_forward", [&] { inner_->swiglu_forward(out, gu, N, F); });
  }
  void swiglu_backward(float* dgu, const float* gu, const float* dout, int N, int F) override {
    time("swiglu_backward", [&] { inner_->swiglu_backward(dgu, gu, dout, N, F); });
  }
  void rope_forward(float* qkv, int B, int T, int NH, int HS, float theta) override {
    time("rope_forward", [&] { inner_->rope_forward(qkv, B, T, NH, HS, theta); });
  }
  void rope_backward(float* dqkv, int B, int T, int NH, int HS, float theta) override {
    time("rope_backward", [&] { inner_->rope_backward(dqkv, B, T, NH, HS, theta); });
  }

 private:
  template <typename Fn>
  void time(const char* what, Fn fn) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    inner_->synchronize();
    seconds_[what] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::unique_ptr<Backend> inner_;
  std::map<std::string, double> seconds_;
};

}  // namespace keel
