// The activation and scratch layouts. One carving routine both sizes a buffer (base ==
// nullptr) and cuts it, so activation_floats/scratch_floats are exact by construction.
//
// Activations, N = B·T rows, every buffer on a 64-float boundary:
//   x0 [N, C]                       stage 0 only (later stages read args->input)
//   per local layer: n1 [N, C] n1_rstd [N] qkv [N, 3·C_l] atty [N, C_l] att [B, NH_l, T, T]
//                    res2 [N, C] n2 [N, C] n2_rstd [N] gate_up [N, 2·F_l] h [N, F_l] res3 [N, C]
//   last stage: nf [N, C] nf_rstd [N] logits [N, V_l]
// Scratch: forward, losses [N]; backward, dres [N, C] dn [N, C], then one region used by the
// MLP backward (dh, dgate_up) and then by the attention backward (datty, dqkv, att_tmp).
#include <algorithm>

#include "examples/plugins/llama/llama_model.h"

namespace llama {
namespace {

constexpr size_t kAlignFloats = 64;

class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(size_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    return p;
  }
  size_t used() const { return used_; }

 private:
  float* base_;
  size_t used_ = 0;
};

LayerActs carve_layer(const Shape& s, int B, int T, Carver& c) {
  const size_t N = size_t(B) * T, C = s.C;
  LayerActs a;
  a.n1 = c.take(N * C);
  a.n1_rstd = c.take(N);
  a.qkv = c.take(N * 3 * s.C_l);
  a.atty = c.take(N * s.C_l);
  a.att = c.take(size_t(B) * s.NH_l * T * T);
  a.res2 = c.take(N * C);
  a.n2 = c.take(N * C);
  a.n2_rstd = c.take(N);
  a.gate_up = c.take(N * 2 * s.F_l);
  a.h = c.take(N * s.F_l);
  a.res3 = c.take(N * C);
  return a;
}

}  // namespace

LayerActs Acts::layer(const Shape& s, int B, int T, int local_layer) const {
  Carver c(layers + size_t(local_layer) * layer_floats);
  return carve_layer(s, B, T, c);
}

size_t carve_acts(const Shape& s, int B, int T, float* base, Acts* out) {
  const size_t N = size_t(B) * T;
  Carver c(base);
  Acts a{};
  if (s.first) a.x0 = c.take(N * s.C);
  Carver one_layer(nullptr);
  carve_layer(s, B, T, one_layer);
  a.layer_floats = one_layer.used();
  a.layers = c.take(a.layer_floats * s.num_local_layers);
  if (s.last) {
    a.nf = c.take(N * s.C);
    a.nf_rstd = c.take(N);
    a.logits = c.take(N * s.V_l);
  }
  if (out) *out = a;
  return c.used();
}

size_t carve_scratch(const Shape& s, int B, int T, float* base, Grads* out) {
  const size_t N = size_t(B) * T;
  Grads g{};
  Carver c(base);
  g.dres = c.take(N * s.C);
  g.losses = g.dres;
  g.dn = c.take(N * s.C);
  const size_t region = c.used();
  Carver mlp(base ? base + region : nullptr);
  g.dh = mlp.take(N * s.F_l);
  g.dgate_up = mlp.take(N * 2 * s.F_l);
  Carver attn(base ? base + region : nullptr);
  g.datty = attn.take(N * s.C_l);
  g.dqkv = attn.take(N * 3 * s.C_l);
  g.att_tmp = attn.take(size_t(B) * s.NH_l * T * T);
  if (out) *out = g;
  return region + std::max(mlp.used(), attn.used());
}

}  // namespace llama
