#include "model/ops_table.h"

#include <limits>

#include "parallel/comm_error.h"
#include "parallel/communicator.h"
#include "runtime/backend.h"
#include "runtime/check.h"

namespace keel {

// The C entry points of the table. Each one runs its body under `guard`, which keeps C++
// exceptions on this side of the boundary: the first one is recorded and every later op is
// skipped, since a plugin that goes on computing after a failure only produces garbage (or,
// on a GPU, more errors that hide the first).
struct OpsThunks {
  static OpsTable& self(void* impl) { return *static_cast<OpsTable*>(impl); }

  template <typename Fn>
  static int guard(void* impl, Fn&& body) {
    OpsTable& t = self(impl);
    if (t.error_) return 1;
    if (t.aborted_ && t.aborted_()) {
      t.error_ = std::make_exception_ptr(CommAborted("the epoch was aborted during a plugin op"));
      return 1;
    }
    try {
      body(t);
      return 0;
    } catch (...) {
      t.error_ = std::current_exception();
      return 1;
    }
  }

  static void fill(void* impl, float* x, size_t n, float value) {
    guard(impl, [&](OpsTable& t) { t.backend_->fill(x, n, value); });
  }
  static void copy(void* impl, float* dst, const float* src, size_t n) {
    guard(impl, [&](OpsTable& t) { t.backend_->copy(dst, src, n * sizeof(float)); });
  }
  static void add(void* impl, float* out, const float* a, const float* b, size_t n) {
    guard(impl, [&](OpsTable& t) { t.backend_->add(out, a, b, n); });
  }
  static void embedding_forward(void* impl, float* out, const int32_t* tokens, const float* wte,
                                const float* wpe, int B, int T, int C, int vocab_begin,
                                int vocab_end) {
    guard(impl, [&](OpsTable& t) {
      t.backend_->embedding_forward(out, tokens, wte, wpe, B, T, C, vocab_begin, vocab_end);
    });
  }
  static void embedding_backward(void* impl, float* dwte, float* dwpe, const float* dout,
                                 const int32_t* tokens, int B, int T, int C, int vocab_begin,
                                 int vocab_end) {
    guard(impl, [&](OpsTable& t) {
      t.backend_->embedding_backward(dwte, dwpe, dout, tokens, B, T, C, vocab_begin, vocab_end);
    });
  }
  static void layernorm_forward(void* impl, float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int N, int C) {
    guard(impl, [&](OpsTable& t) {
      t.backend_->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    });
  }
  static void layernorm_backward(void* impl, float* dinp, float* dweight, float* dbias,
                                 const float* dout, const float* inp, const float* weight,
                                 const float* mean, const float* rstd, int N, int C) {
    guard(impl, [&](OpsTable& t) {
      t.backend_->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    });
  }
  static void matmul_forward(void* impl, float* out, const float* inp, const float* weight,
                             const float* bias, int N, int C, int OC) {
    guard(impl, [&](OpsTable& t) { t.backend_->matmul_forward(out, inp, weight, bias, N, C, OC); });
  }
  static void matmul_backward(void* impl, float* dinp, float* dweight, float* dbias,
                              const float* dout, const float* inp, const float* weight, int N,
                              int C, int OC) {
    guard(impl, [&](OpsTable& t) {
      t.backend_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    });
  }
  static void attention_forward(void* impl, float* out, float* att, const float* qkv, int B, int T,
                                int NH, int HS) {
    guard(impl, [&](OpsTable& t) { t.backend_->attention_forward(out, att, qkv, B, T, NH, HS); });
  }
  static void attention_backward(void* impl, float* dqkv, float* scratch, const float* dout,
                                 const float* qkv, const float* att, int B, int T, int NH, int HS) {
    guard(impl, [&](OpsTable& t) {
      t.backend_->attention_backward(dqkv, scratch, dout, qkv, att, B, T, NH, HS);
    });
  }
  static void gelu_forward(void* impl, float* out, const float* inp, size_t n) {
    guard(impl, [&](OpsTable& t) { t.backend_->gelu_forward(out, inp, n); });
  }
  static void gelu_backward(void* impl, float* dinp, const float* inp, const float* dout,
                            size_t n) {
    guard(impl, [&](OpsTable& t) { t.backend_->gelu_backward(dinp, inp, dout, n); });
  }

  // Megatron's vocab-parallel cross-entropy: each rank holds a slice of every row's logits,
  // so the row max and the softmax denominator are reduced over TP instead of gathering the
  // logits. The max goes first (alone: it is a different reduction); the denominator and
  // the target's logit (non-zero on exactly one rank) then travel in one sum.
  static int cross_entropy(void* impl, float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int N, int V_local, int vocab_begin,
                           int vocab_size, float loss_scale) {
    return guard(impl, [&](OpsTable& t) {
      float* row_max = t.xent_buffer(size_t(N));
      float* sum_exp = row_max + N;
      float* target_logit = sum_exp + N;
      Backend& b = *t.backend_;
      b.xent_row_max(row_max, logits, N, V_local, vocab_begin, vocab_size);
      if (t.tp_) t.tp_->all_reduce(row_max, size_t(N), ReduceOp::kMax);
      b.xent_sum_exp(sum_exp, target_logit, logits, row_max, targets, N, V_local, vocab_begin,
                     vocab_size);
      if (t.tp_) t.tp_->all_reduce(sum_exp, 2 * size_t(N), ReduceOp::kSum);
      b.xent_finish(losses, dlogits, logits, row_max, sum_exp, target_logit, targets, N, V_local,
                    vocab_begin, vocab_size, loss_scale);
    });
  }

  static int tp_all_reduce(void* impl, float* x, size_t n) {
    return guard(impl, [&](OpsTable& t) {
      if (t.tp_) t.tp_->all_reduce(x, n, ReduceOp::kSum);
    });
  }

  static double sum(void* impl, const float* x, size_t n) {
    double s = std::numeric_limits<double>::quiet_NaN();
    guard(impl, [&](OpsTable& t) { s = t.backend_->sum(x, n); });
    return s;
  }

  static void grad_ready(void* impl, int index) {
    guard(impl, [&](OpsTable& t) {
      if (t.grad_ready_) t.grad_ready_(index);
    });
  }

  static void rmsnorm_forward(void* impl, float* out, float* rstd, const float* inp,
                              const float* weight, int N, int C) {
    guard(impl, [&](OpsTable& t) { t.backend_->rmsnorm_forward(out, rstd, inp, weight, N, C); });
  }
  static void rmsnorm_backward(void* impl, float* dinp, float* dweight, const float* dout,
                               const float* inp, const float* weight, const float* rstd, int N,
                               int C) {
    guard(impl, [&](OpsTable& t) {
      t.backend_->rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
    });
  }
  static void swiglu_forward(void* impl, float* out, const float* gate_up, int N, int F) {
    guard(impl, [&](OpsTable& t) { t.backend_->swiglu_forward(out, gate_up, N, F); });
  }
  static void swiglu_backward(void* impl, float* dgate_up, const float* gate_up, const float* dout,
                              int N, int F) {
    guard(impl, [&](OpsTable& t) { t.backend_->swiglu_backward(dgate_up, gate_up, dout, N, F); });
  }
  static void rope_forward(void* impl, float* qkv, int B, int T, int NH, int HS, float theta) {
    guard(impl, [&](OpsTable& t) { t.backend_->rope_forward(qkv, B, T, NH, HS, theta); });
  }
  static void rope_backward(void* impl, float* dqkv, int B, int T, int NH, int HS, float theta) {
    guard(impl, [&](OpsTable& t) { t.backend_->rope_backward(dqkv, B, T, NH, HS, theta); });
  }
};

OpsTable::OpsTable(Backend* backend, Communicator* tp) : backend_(backend), tp_(tp) {
  KEEL_CHECK(backend_ != nullptr, "OpsTable needs a backend");
  // A group of one reduces nothing; skipping it keeps tp == 1 free of communicator calls.
  if (tp_ && tp_->size() == 1) tp_ = nullptr;
  ops_.struct_size = sizeof(keel_ops);
  ops_.impl = this;
  ops_.fill = &OpsThunks::fill;
  ops_.copy = &OpsThunks::copy;
  ops_.add = &OpsThunks::add;
  ops_.embedding_forward = &OpsThunks::embedding_forward;
  ops_.embedding_backward = &OpsThunks::embedding_backward;
  ops_.layernorm_forward = &OpsThunks::layernorm_forward;
  ops_.layernorm_backward = &OpsThunks::layernorm_backward;
  ops_.matmul_forward = &OpsThunks::matmul_forward;
  ops_.matmul_backward = &OpsThunks::matmul_backward;
  ops_.attention_forward = &OpsThunks::attention_forward;
  ops_.attention_backward = &OpsThunks::attention_backward;
  ops_.gelu_forward = &OpsThunks::gelu_forward;
  ops_.gelu_backward = &OpsThunks::gelu_backward;
  ops_.cross_entropy = &OpsThunks::cross_entropy;
  ops_.tp_all_reduce = &OpsThunks::tp_all_reduce;
  ops_.sum = &OpsThunks::sum;
  ops_.grad_ready = &OpsThunks::grad_ready;
  ops_.rmsnorm_forward = &OpsThunks::rmsnorm_forward;
  ops_.rmsnorm_backward = &OpsThunks::rmsnorm_backward;
  ops_.swiglu_forward = &OpsThunks::swiglu_forward;
  ops_.swiglu_backward = &OpsThunks::swiglu_backward;
  ops_.rope_forward = &OpsThunks::rope_forward;
  ops_.rope_backward = &OpsThunks::rope_backward;
}

OpsTable::~OpsTable() {
  backend_->free(xent_);
}

void OpsTable::rethrow_if_failed() {
  if (!error_) return;
  std::exception_ptr e = error_;
  error_ = nullptr;
  std::rethrow_exception(e);
}

float* OpsTable::xent_buffer(size_t n_rows) {
  if (n_rows > xent_rows_) {
    backend_->free(xent_);
    xent_ = nullptr;
    xent_rows_ = 0;
    xent_ = static_cast<float*>(backend_->alloc(3 * n_rows * sizeof(float)));
    xent_rows_ = n_rows;
  }
  return xent_;
}

}  // namespace keel
