// The activation and scratch layouts. One carving routine both sizes a buffer (base ==
// nullptr) and cuts it, so activation_floats/scratch_floats are exact by construction.
//
// Activations of one stage, N = B·T rows, *_l the TP-local widths, every buffer starting on a
// 64-float (256-byte) boundary so that device kernels may use vector loads:
//   x0        [N, C]              stage 0 only: the embedding (later stages read args->input,
//                                 which the runtime keeps unchanged until the backward)
//   per local layer, in order:
//     ln1 [N, C]  ln1_mean [N]  ln1_rstd [N]
//     qkv [N, 3·C_l]  atty [N, C_l]  att [B, NH_l, T, T]
//     res2 [N, C]  ln2 [N, C]  ln2_mean [N]  ln2_rstd [N]
//     fch [N, F_l]  fch_gelu [N, F_l]  res3 [N, C]
//   last stage: lnf [N, C]  lnf_mean [N]  lnf_rstd [N]  logits [N, V_l]
// The attention-projection and MLP-projection outputs are written straight into res2/res3
// (all-reduced, then the residual added in place): backward never reads them on their own.
// The logits buffer holds dlogits after forward (cross_entropy works in place), which is all
// backward needs of the head.
//
// Scratch, valid during one call:
//   forward:  losses [N]
//   backward: dres [N, C]  dln [N, C]  then one region used first by the MLP backward
//             (dfch_gelu, dfch: [N, F_l] each) and then by the attention backward
//             (datty [N, C_l], dqkv [N, 3·C_l], att_tmp [B, NH_l, T, T]).
#include "model/gpt/gpt_model.h"

#include <algorithm>

namespace keel::gpt {
namespace {

constexpr size_t kAlignFloats = 64;

size_t round_up(size_t n) {
  return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

// Hands out consecutive aligned pieces of `base`; with base == nullptr it only counts.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(size_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += round_up(n);
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
  a.ln1 = c.take(N * C);
  a.ln1_mean = c.take(N);
  a.ln1_rstd = c.take(N);
  a.qkv = c.take(N * 3 * s.C_l);
  a.atty = c.take(N * s.C_l);
  a.att = c.take(size_t(B) * s.NH_l * T * T);
  a.res2 = c.take(N * C);
  a.ln2 = c.take(N * C);
  a.ln2_mean = c.take(N);
  a.ln2_rstd = c.take(N);
  a.fch = c.take(N * s.F_l);
  a.fch_gelu = c.take(N * s.F_l);
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
    a.lnf = c.take(N * s.C);
    a.lnf_mean = c.take(N);
    a.lnf_rstd = c.take(N);
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
  g.dln = c.take(N * s.C);
  const size_t region_start = c.used();
  Carver mlp(base ? base + region_start : nullptr);
  g.dfch_gelu = mlp.take(N * s.F_l);
  g.dfch = mlp.take(N * s.F_l);
  Carver attn(base ? base + region_start : nullptr);
  g.datty = attn.take(N * s.C_l);
  g.dqkv = attn.take(N * 3 * s.C_l);
  g.att_tmp = attn.take(size_t(B) * s.NH_l * T * T);
  if (out) *out = g;
  // losses [N] fits in dres [N, C], so forward adds nothing.
  return region_start + std::max(mlp.used(), attn.used());
}

}  // namespace keel::gpt
