// Which configs the Llama plugin serves and the parameters it asks the runtime for.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "examples/plugins/llama/llama_model.h"

namespace llama {
namespace {

[[gnu::format(printf, 3, 4)]] int fail(char* err, size_t err_len, const char* fmt, ...) {
  if (err && err_len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return 1;
}

bool fits_int(int64_t v) {
  return v > 0 && v <= INT32_MAX;
}

}  // namespace

int validate(const keel_model_dims* d, const keel_stage* s, char* err, size_t err_len) {
  if (!d) return fail(err, err_len, "dims is NULL");
  if (!s) return fail(err, err_len, "stage is NULL");
#define LLAMA_REQUIRE(cond, ...) \
  if (!(cond)) return fail(err, err_len, __VA_ARGS__)
  LLAMA_REQUIRE(d->num_layers >= 1, "num_layers = %d, must be >= 1", d->num_layers);
  LLAMA_REQUIRE(d->hidden_size >= 1, "hidden_size = %d, must be >= 1", d->hidden_size);
  LLAMA_REQUIRE(d->num_heads >= 1, "num_heads = %d, must be >= 1", d->num_heads);
  LLAMA_REQUIRE(d->hidden_size % d->num_heads == 0,
                "hidden_size = %d is not divisible by num_heads = %d", d->hidden_size,
                d->num_heads);
  // RoPE rotates pairs of channels.
  LLAMA_REQUIRE((d->hidden_size / d->num_heads) % 2 == 0,
                "head size hidden_size / num_heads = %d is odd; rotary embeddings need it even",
                d->hidden_size / d->num_heads);
  LLAMA_REQUIRE(d->ffn_hidden_size >= 1, "ffn_hidden_size = %d, must be >= 1", d->ffn_hidden_size);
  LLAMA_REQUIRE(d->seq_len >= 1, "seq_len = %d, must be >= 1", d->seq_len);
  LLAMA_REQUIRE(d->vocab_size >= 1, "vocab_size = %d, must be >= 1", d->vocab_size);
  LLAMA_REQUIRE(d->padded_vocab_size >= d->vocab_size,
                "padded_vocab_size = %d is smaller than vocab_size = %d", d->padded_vocab_size,
                d->vocab_size);
  LLAMA_REQUIRE(std::isfinite(d->init_std) && d->init_std > 0,
                "init_std = %g, must be a positive number", double(d->init_std));
  LLAMA_REQUIRE(fits_int(3 * int64_t(d->hidden_size)) &&
                    fits_int(int64_t(d->padded_vocab_size) * d->hidden_size) &&
                    fits_int(2 * int64_t(d->ffn_hidden_size) * d->hidden_size),
                "hidden_size = %d, ffn_hidden_size = %d, padded_vocab_size = %d: a weight has "
                "more than 2^31 elements",
                d->hidden_size, d->ffn_hidden_size, d->padded_vocab_size);
  LLAMA_REQUIRE(s->tp_size >= 1, "tp_size = %d, must be >= 1", s->tp_size);
  LLAMA_REQUIRE(s->tp_rank >= 0 && s->tp_rank < s->tp_size,
                "tp_rank = %d is outside [0, tp_size = %d)", s->tp_rank, s->tp_size);
  LLAMA_REQUIRE(s->pp_size >= 1, "pp_size = %d, must be >= 1", s->pp_size);
  LLAMA_REQUIRE(s->pp_rank >= 0 && s->pp_rank < s->pp_size,
                "pp_rank = %d is outside [0, pp_size = %d)", s->pp_rank, s->pp_size);
  LLAMA_REQUIRE(d->num_heads % s->tp_size == 0, "num_heads = %d is not divisible by tp_size = %d",
                d->num_heads, s->tp_size);
  LLAMA_REQUIRE(d->ffn_hidden_size % s->tp_size == 0,
                "ffn_hidden_size = %d is not divisible by tp_size = %d", d->ffn_hidden_size,
                s->tp_size);
  LLAMA_REQUIRE(d->padded_vocab_size % s->tp_size == 0,
                "padded_vocab_size = %d is not divisible by tp_size = %d", d->padded_vocab_size,
                s->tp_size);
  LLAMA_REQUIRE(s->layer_begin >= 0 && s->layer_begin < d->num_layers,
                "layer_begin = %d is outside [0, num_layers = %d)", s->layer_begin, d->num_layers);
  LLAMA_REQUIRE(s->layer_end > s->layer_begin && s->layer_end <= d->num_layers,
                "layer_end = %d is outside (layer_begin = %d, num_layers = %d]", s->layer_end,
                s->layer_begin, d->num_layers);
  LLAMA_REQUIRE(s->pp_rank != 0 || s->layer_begin == 0,
                "layer_begin = %d on pp_rank 0, which must start at layer 0", s->layer_begin);
  LLAMA_REQUIRE(s->pp_rank != s->pp_size - 1 || s->layer_end == d->num_layers,
                "layer_end = %d on the last pp_rank %d, which must end at num_layers = %d",
                s->layer_end, s->pp_rank, d->num_layers);
#undef LLAMA_REQUIRE
  return 0;
}

Shape make_shape(const keel_model_dims& d, const keel_stage& st) {
  Shape s{};
  s.L = d.num_layers;
  s.C = d.hidden_size;
  s.NH = d.num_heads;
  s.HS = d.hidden_size / d.num_heads;
  s.F = d.ffn_hidden_size;
  s.T = d.seq_len;
  s.V = d.vocab_size;
  s.Vp = d.padded_vocab_size;
  s.tp = st.tp_size;
  s.tp_rank = st.tp_rank;
  s.NH_l = s.NH / s.tp;
  s.C_l = s.NH_l * s.HS;
  s.F_l = s.F / s.tp;
  s.V_l = s.Vp / s.tp;
  s.vocab_begin = s.tp_rank * s.V_l;
  s.layer_begin = st.layer_begin;
  s.num_local_layers = st.layer_end - st.layer_begin;
  s.first = st.pp_rank == 0;
  s.last = st.pp_rank == st.pp_size - 1;
  return s;
}

ParamIndex param_index(const Shape& s) {
  ParamIndex p;
  int n = 0;
  if (s.first) p.embed = n++;
  p.layers = n;
  n += s.num_local_layers * kLayerParams;
  if (s.last) {
    p.norm = n++;
    p.lm_head = n++;
  }
  p.count = n;
  return p;
}

namespace {

// Appends descriptors while counting them: one pass both sizes and fills the array.
class DescWriter {
 public:
  DescWriter(keel_param_desc* out, int capacity) : out_(out), capacity_(capacity) {}
  int count() const { return n_; }

  // Name, shape, TP split (tp_dim -1: replicated) and init of the next parameter. Matrices
  // are weight-decayed, the RMSNorm gains are not.
  void add(const char* name, std::initializer_list<int64_t> shape, int tp_dim, int tp_blocks,
           keel_init init, float std) {
    keel_param_desc* d = n_ < capacity_ && out_ ? &out_[n_] : nullptr;
    ++n_;
    if (!d) return;
    std::memset(d, 0, sizeof(*d));
    std::snprintf(d->name, sizeof(d->name), "%s", name);
    d->ndim = int32_t(shape.size());
    int i = 0;
    for (int64_t v : shape) d->shape[i++] = v;
    d->tp_dim = tp_dim;
    d->tp_blocks = tp_blocks;
    d->init = init;
    d->init_std = init == KEEL_INIT_NORMAL ? std : 0.0f;
    d->flags = d->ndim >= 2 ? KEEL_PARAM_WEIGHT_DECAY : 0u;
  }

 private:
  keel_param_desc* out_;
  int capacity_;
  int n_ = 0;
};

}  // namespace

int describe_params(const keel_model_dims* dims, const keel_stage* stage, keel_param_desc* out,
                    int capacity) {
  if (validate(dims, stage, nullptr, 0) != 0) return 0;
  const Shape s = make_shape(*dims, *stage);
  const float std = dims->init_std;
  // Projections into the residual stream scaled by 1/sqrt(2·L), as GPT-2 does.
  const float proj_std = float(std / std::sqrt(2.0 * s.L));
  const int64_t C = s.C, F = s.F;
  DescWriter w(out, capacity);
  char name[KEEL_PARAM_NAME_MAX];
  auto layer_name = [&](int l, const char* what) {
    std::snprintf(name, sizeof(name), "h.%d.%s", l, what);
    return name;
  };
  // Vocab-parallel embedding: each TP rank holds Vp/tp rows.
  if (s.first) w.add("embed.weight", {s.Vp, C}, 0, 1, KEEL_INIT_NORMAL, std);
  for (int l = s.layer_begin; l < s.layer_begin + s.num_local_layers; ++l) {
    w.add(layer_name(l, "attn_norm.weight"), {C}, -1, 1, KEEL_INIT_ONES, 0);
    // Column-parallel, q|k|v as three blocks: each rank gets its heads of all three.
    w.add(layer_name(l, "attn.qkv.weight"), {3 * C, C}, 0, 3, KEEL_INIT_NORMAL, std);
    // Row-parallel: each rank holds the input columns of its heads.
    w.add(layer_name(l, "attn.proj.weight"), {C, C}, 1, 1, KEEL_INIT_NORMAL, proj_std);
    w.add(layer_name(l, "mlp_norm.weight"), {C}, -1, 1, KEEL_INIT_ONES, 0);
    // Column-parallel, gate|up as two blocks, so a rank's output rows are its gate columns
    // then its up columns: the layout swiglu_forward reads.
    w.add(layer_name(l, "mlp.gate_up.weight"), {2 * F, C}, 0, 2, KEEL_INIT_NORMAL, std);
    w.add(layer_name(l, "mlp.down.weight"), {C, F}, 1, 1, KEEL_INIT_NORMAL, proj_std);
  }
  if (s.last) {
    w.add("norm.weight", {C}, -1, 1, KEEL_INIT_ONES, 0);
    // Untied: the head is its own parameter, vocab-parallel like the embedding; no tied_to.
    w.add("lm_head.weight", {s.Vp, C}, 0, 1, KEEL_INIT_NORMAL, std);
  }
  return w.count();
}

}  // namespace llama
