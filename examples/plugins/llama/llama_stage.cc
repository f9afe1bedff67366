// Forward and backward of one pipeline stage of a Llama-style decoder with Megatron's tensor
// parallelism: qkv and gate|up are column-parallel, attn.proj and mlp.down row-parallel (their
// partial products summed over TP), the input gradient of every column-parallel matmul summed
// over TP in backward; embedding and head are vocab-parallel. Everything between those sums
// is identical on every TP rank, so the replicated gains' gradients need no reduction.
#include "examples/plugins/llama/llama_model.h"

namespace llama {
namespace {

// A communicating op failed: the runtime recorded why; hand its status back untouched.
#define LLAMA_COMM(call)                  \
  do {                                    \
    int llama_rc_ = (call);               \
    if (llama_rc_ != 0) return llama_rc_; \
  } while (0)

bool args_ok(const Shape& s, const keel_stage_args* a, bool backward) {
  // A runtime older than ABI 3 lends a shorter table without the RMSNorm/SwiGLU/RoPE ops.
  if (!a || !a->ops || a->ops->struct_size < sizeof(keel_ops) || !a->params) return false;
  if (a->B < 1 || a->T < 1 || a->T > s.T) return false;
  if (int64_t(a->B) * a->T > INT32_MAX) return false;
  if (!a->activations || !a->scratch) return false;
  if (backward && !a->grads) return false;
  if (s.first && !a->tokens) return false;
  if (s.last && !a->targets) return false;
  if (!s.first && (!a->input || (backward && !a->dinput))) return false;
  if (!s.last && !(backward ? static_cast<const void*>(a->dout) : a->output)) return false;
  return true;
}

}  // namespace

int forward(const keel_model_dims* dims, const keel_stage* stage, keel_stage_args* args) {
  if (!dims || !stage || validate(dims, stage, nullptr, 0) != 0) return kBadArgs;
  const Shape s = make_shape(*dims, *stage);
  if (!args_ok(s, args, false)) return kBadArgs;
  const keel_ops& o = *args->ops;
  void* h = o.impl;
  const ParamIndex pi = param_index(s);
  float* const* P = args->params;
  const int B = args->B, T = args->T, N = B * T, C = s.C;
  const size_t NC = size_t(N) * C;
  const bool tp = s.tp > 1;
  Acts a;
  carve_acts(s, B, T, args->activations, &a);

  const float* x = args->input;
  if (s.first) {
    // Each rank embeds the tokens of its vocab rows (zeros elsewhere); the TP sum assembles
    // the embedding. No learned positions: RoPE carries them.
    o.embedding_forward(h, a.x0, args->tokens, P[pi.embed], nullptr, B, T, C, s.vocab_begin,
                        s.vocab_begin + s.V_l);
    if (tp) LLAMA_COMM(o.tp_all_reduce(h, a.x0, NC));
    x = a.x0;
  }

  for (int l = 0; l < s.num_local_layers; ++l) {
    const LayerActs la = a.layer(s, B, T, l);
    float* const* p = P + pi.layer(l, LayerParam(0));
    o.rmsnorm_forward(h, la.n1, la.n1_rstd, x, p[kAttnNorm], N, C);
    o.matmul_forward(h, la.qkv, la.n1, p[kQkv], nullptr, N, C, 3 * s.C_l);
    o.rope_forward(h, la.qkv, B, T, s.NH_l, s.HS, kRopeTheta);
    o.attention_forward(h, la.atty, la.att, la.qkv, B, T, s.NH_l, s.HS);
    o.matmul_forward(h, la.res2, la.atty, p[kAttnProj], nullptr, N, s.C_l, C);
    if (tp) LLAMA_COMM(o.tp_all_reduce(h, la.res2, NC));
    o.add(h, la.res2, la.res2, x, NC);

    o.rmsnorm_forward(h, la.n2, la.n2_rstd, la.res2, p[kMlpNorm], N, C);
    o.matmul_forward(h, la.gate_up, la.n2, p[kGateUp], nullptr, N, C, 2 * s.F_l);
    o.swiglu_forward(h, la.h, la.gate_up, N, s.F_l);
    o.matmul_forward(h, la.res3, la.h, p[kDown], nullptr, N, s.F_l, C);
    if (tp) LLAMA_COMM(o.tp_all_reduce(h, la.res3, NC));
    o.add(h, la.res3, la.res3, la.res2, NC);
    x = la.res3;
  }

  if (!s.last) {
    o.copy(h, args->output, x, NC);
    return 0;
  }
  Grads g;
  carve_scratch(s, B, T, args->scratch, &g);
  o.rmsnorm_forward(h, a.nf, a.nf_rstd, x, P[pi.norm], N, C);
  o.matmul_forward(h, a.logits, a.nf, P[pi.lm_head], nullptr, N, C, s.V_l);
  LLAMA_COMM(o.cross_entropy(h, g.losses, a.logits, a.logits, args->targets, N, s.V_l,
                             s.vocab_begin, s.V, args->loss_scale));
  args->loss_sum = o.sum(h, g.losses, size_t(N));
  return 0;
}

int backward(const keel_model_dims* dims, const keel_stage* stage, keel_stage_args* args) {
  if (!dims || !stage || validate(dims, stage, nullptr, 0) != 0) return kBadArgs;
  const Shape s = make_shape(*dims, *stage);
  if (!args_ok(s, args, true)) return kBadArgs;
  const keel_ops& o = *args->ops;
  void* h = o.impl;
  const ParamIndex pi = param_index(s);
  float* const* P = args->params;
  float* const* G = args->grads;
  const int B = args->B, T = args->T, N = B * T, C = s.C;
  const size_t NC = size_t(N) * C;
  const bool tp = s.tp > 1;
  Acts a;
  carve_acts(s, B, T, args->activations, &a);
  Grads g;
  carve_scratch(s, B, T, args->scratch, &g);
  auto layer_in = [&](int l) -> const float* {
    if (l > 0) return a.layer(s, B, T, l - 1).res3;
    return s.first ? a.x0 : args->input;
  };

  if (s.last) {
    // forward left loss_scale·dloss/dlogits in a.logits.
    o.fill(h, g.dn, NC, 0.0f);
    o.matmul_backward(h, g.dn, G[pi.lm_head], nullptr, a.logits, a.nf, P[pi.lm_head], N, C, s.V_l);
    if (tp) LLAMA_COMM(o.tp_all_reduce(h, g.dn, NC));
    o.grad_ready(h, pi.lm_head);
    o.fill(h, g.dres, NC, 0.0f);
    o.rmsnorm_backward(h, g.dres, G[pi.norm], g.dn, layer_in(s.num_local_layers), P[pi.norm],
                       a.nf_rstd, N, C);
    o.grad_ready(h, pi.norm);
  } else {
    o.copy(h, g.dres, args->dout, NC);
  }

  for (int l = s.num_local_layers - 1; l >= 0; --l) {
    const LayerActs la = a.layer(s, B, T, l);
    const int base = pi.layer(l, LayerParam(0));
    float* const* p = P + base;
    float* const* dp = G + base;
    const size_t NF = size_t(N) * s.F_l;

    // MLP: mlp.down is row-parallel (local input gradient); gate|up column-parallel (its
    // input gradient summed over TP).
    o.fill(h, g.dh, NF, 0.0f);
    o.fill(h, g.dgate_up, 2 * NF, 0.0f);
    o.matmul_backward(h, g.dh, dp[kDown], nullptr, g.dres, la.h, p[kDown], N, s.F_l, C);
    o.swiglu_backward(h, g.dgate_up, la.gate_up, g.dh, N, s.F_l);
    o.fill(h, g.dn, NC, 0.0f);
    o.matmul_backward(h, g.dn, dp[kGateUp], nullptr, g.dgate_up, la.n2, p[kGateUp], N, C,
                      2 * s.F_l);
    if (tp) LLAMA_COMM(o.tp_all_reduce(h, g.dn, NC));
    o.rmsnorm_backward(h, g.dres, dp[kMlpNorm], g.dn, la.res2, p[kMlpNorm], la.n2_rstd, N, C);

    // Attention. The gradient attention_backward leaves is that of the rotated q and k;
    // rope_backward turns it into the gradient of the qkv matmul's output.
    o.fill(h, g.datty, size_t(N) * s.C_l, 0.0f);
    o.fill(h, g.dqkv, size_t(N) * 3 * s.C_l, 0.0f);
    o.matmul_backward(h, g.datty, dp[kAttnProj], nullptr, g.dres, la.atty, p[kAttnProj], N, s.C_l,
                      C);
    o.attention_backward(h, g.dqkv, g.att_tmp, g.datty, la.qkv, la.att, B, T, s.NH_l, s.HS);
    o.rope_backward(h, g.dqkv, B, T, s.NH_l, s.HS, kRopeTheta);
    o.fill(h, g.dn, NC, 0.0f);
    o.matmul_backward(h, g.dn, dp[kQkv], nullptr, g.dqkv, la.n1, p[kQkv], N, C, 3 * s.C_l);
    if (tp) LLAMA_COMM(o.tp_all_reduce(h, g.dn, NC));
    o.rmsnorm_backward(h, g.dres, dp[kAttnNorm], g.dn, layer_in(l), p[kAttnNorm], la.n1_rstd, N, C);

    for (int i = kLayerParams - 1; i >= 0; --i) o.grad_ready(h, base + i);
  }

  if (s.first) {
    o.embedding_backward(h, G[pi.embed], nullptr, g.dres, args->tokens, B, T, C, s.vocab_begin,
                         s.vocab_begin + s.V_l);
    o.grad_ready(h, pi.embed);
  } else {
    o.copy(h, args->dinput, g.dres, NC);
  }
  return 0;
}

#undef LLAMA_COMM

}  // namespace llama
