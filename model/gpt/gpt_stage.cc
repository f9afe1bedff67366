// Forward and backward of one pipeline stage of GPT-2 (llm.c's math) with Megatron's tensor
// parallelism: the qkv and fc matmuls are column-parallel (each rank owns some heads / some MLP
// columns), attn.proj and mlp.proj are row-parallel (each rank's partial product is summed
// over TP: Megatron's "g"), and the input of every column-parallel matmul has its gradient
// summed over TP in backward (Megatron's "f"). Embedding and head are vocab-parallel.
// Everything between those sums is identical on every TP rank, so the replicated parameters'
// gradients come out identical without being reduced.
#include <cstdint>

#include "model/gpt/gpt_model.h"

namespace keel::gpt {
namespace {

// A communicating op failed: the runtime recorded why; hand its status back untouched.
#define KEEL_GPT_COMM(call)             \
  do {                                  \
    int keel_rc_ = (call);              \
    if (keel_rc_ != 0) return keel_rc_; \
  } while (0)

bool args_ok(const Shape& s, const keel_stage_args* a, bool backward) {
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
  // Row-parallel biases are added by one rank only, so the TP sum counts them once.
  const bool bias_rank = s.tp_rank == 0;
  Acts a;
  carve_acts(s, B, T, args->activations, &a);

  // A later stage reads its input in place: the runtime keeps it for the backward.
  const float* x = args->input;
  if (s.first) {
    // Each rank embeds the tokens of its vocab rows (zero elsewhere); the sum over TP
    // assembles the embedding, with wpe added by one rank so it is counted once.
    o.embedding_forward(h, a.x0, args->tokens, P[pi.wte], bias_rank ? P[pi.wpe] : nullptr, B, T, C,
                        s.vocab_begin, s.vocab_begin + s.V_l);
    if (tp) KEEL_GPT_COMM(o.tp_all_reduce(h, a.x0, NC));
    x = a.x0;
  }

  for (int l = 0; l < s.num_local_layers; ++l) {
    const LayerActs la = a.layer(s, B, T, l);
    float* const* p = P + pi.layer(l, LayerParam(0));
    o.layernorm_forward(h, la.ln1, la.ln1_mean, la.ln1_rstd, x, p[kLn1W], p[kLn1B], N, C);
    o.matmul_forward(h, la.qkv, la.ln1, p[kQkvW], p[kQkvB], N, C, 3 * s.C_l);
    o.attention_forward(h, la.atty, la.att, la.qkv, B, T, s.NH_l, s.HS);
    o.matmul_forward(h, la.res2, la.atty, p[kAttnProjW], bias_rank ? p[kAttnProjB] : nullptr, N,
                     s.C_l, C);
    if (tp) KEEL_GPT_COMM(o.tp_all_reduce(h, la.res2, NC));
    o.add(h, la.res2, la.res2, x, NC);

    o.layernorm_forward(h, la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, p[kLn2W], p[kLn2B], N, C);
    o.matmul_forward(h, la.fch, la.ln2, p[kFcW], p[kFcB], N, C, s.F_l);
    o.gelu_forward(h, la.fch_gelu, la.fch, size_t(N) * s.F_l);
    o.matmul_forward(h, la.res3, la.fch_gelu, p[kMlpProjW], bias_rank ? p[kMlpProjB] : nullptr, N,
                     s.F_l, C);
    if (tp) KEEL_GPT_COMM(o.tp_all_reduce(h, la.res3, NC));
    o.add(h, la.res3, la.res3, la.res2, NC);
    x = la.res3;
  }

  if (!s.last) {
    o.copy(h, args->output, x, NC);
    return 0;
  }
  Grads g;
  carve_scratch(s, B, T, args->scratch, &g);
  o.layernorm_forward(h, a.lnf, a.lnf_mean, a.lnf_rstd, x, P[pi.lnf_w], P[pi.lnf_b], N, C);
  o.matmul_forward(h, a.logits, a.lnf, P[pi.head_wte], nullptr, N, C, s.V_l);
  KEEL_GPT_COMM(o.cross_entropy(h, g.losses, a.logits, a.logits, args->targets, N, s.V_l,
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
  auto layer_out = [&](int l) -> const float* {
    if (l >= 0) return a.layer(s, B, T, l).res3;
    return s.first ? a.x0 : args->input;
  };

  if (s.last) {
    // Head: forward left loss_scale·dloss/dlogits in a.logits.
    o.fill(h, g.dln, NC, 0.0f);
    o.matmul_backward(h, g.dln, G[pi.head_wte], nullptr, a.logits, a.lnf, P[pi.head_wte], N, C,
                      s.V_l);
    if (tp) KEEL_GPT_COMM(o.tp_all_reduce(h, g.dln, NC));
    // With pp == 1 the head's wte is the embedding's, which stage 0's end still adds to.
    if (s.head_copy) o.grad_ready(h, pi.head_wte);
    o.fill(h, g.dres, NC, 0.0f);
    o.layernorm_backward(h, g.dres, G[pi.lnf_w], G[pi.lnf_b], g.dln,
                         layer_out(s.num_local_layers - 1), P[pi.lnf_w], a.lnf_mean, a.lnf_rstd, N,
                         C);
    o.grad_ready(h, pi.lnf_b);
    o.grad_ready(h, pi.lnf_w);
  } else {
    o.copy(h, g.dres, args->dout, NC);
  }

  // g.dres is the gradient of the current layer's output; each LayerNorm backward adds the
  // branch's contribution to it, so on leaving a layer it is the gradient of its input.
  for (int l = s.num_local_layers - 1; l >= 0; --l) {
    const LayerActs la = a.layer(s, B, T, l);
    const int base = pi.layer(l, LayerParam(0));
    float* const* p = P + base;
    float* const* dp = G + base;
    const size_t NF = size_t(N) * s.F_l;

    // MLP. mlp.proj is row-parallel: its input gradient is local, no communication.
    o.fill(h, g.dfch_gelu, NF, 0.0f);
    o.fill(h, g.dfch, NF, 0.0f);
    o.matmul_backward(h, g.dfch_gelu, dp[kMlpProjW], dp[kMlpProjB], g.dres, la.fch_gelu,
                      p[kMlpProjW], N, s.F_l, C);
    o.gelu_backward(h, g.dfch, la.fch, g.dfch_gelu, NF);
    o.fill(h, g.dln, NC, 0.0f);
    o.matmul_backward(h, g.dln, dp[kFcW], dp[kFcB], g.dfch, la.ln2, p[kFcW], N, C, s.F_l);
    if (tp) KEEL_GPT_COMM(o.tp_all_reduce(h, g.dln, NC));
    o.layernorm_backward(h, g.dres, dp[kLn2W], dp[kLn2B], g.dln, la.res2, p[kLn2W], la.ln2_mean,
                         la.ln2_rstd, N, C);

    // Attention, the same pattern. Its scratch needs no zeroing: the kernel's contract says it
    // ignores what the scratch holds on entry (model/plugin.h).
    o.fill(h, g.datty, size_t(N) * s.C_l, 0.0f);
    o.fill(h, g.dqkv, size_t(N) * 3 * s.C_l, 0.0f);
    o.matmul_backward(h, g.datty, dp[kAttnProjW], dp[kAttnProjB], g.dres, la.atty, p[kAttnProjW], N,
                      s.C_l, C);
    o.attention_backward(h, g.dqkv, g.att_tmp, g.datty, la.qkv, la.att, B, T, s.NH_l, s.HS);
    o.fill(h, g.dln, NC, 0.0f);
    o.matmul_backward(h, g.dln, dp[kQkvW], dp[kQkvB], g.dqkv, la.ln1, p[kQkvW], N, C, 3 * s.C_l);
    if (tp) KEEL_GPT_COMM(o.tp_all_reduce(h, g.dln, NC));
    o.layernorm_backward(h, g.dres, dp[kLn1W], dp[kLn1B], g.dln, layer_out(l - 1), p[kLn1W],
                         la.ln1_mean, la.ln1_rstd, N, C);

    for (int i = kLayerParams - 1; i >= 0; --i) o.grad_ready(h, base + i);
  }

  if (s.first) {
    // dres is the full gradient of the embedding sum on every rank: each rank takes its vocab
    // rows of wte, and all of wpe (replicated, so its gradient must be whole everywhere).
    o.embedding_backward(h, G[pi.wte], G[pi.wpe], g.dres, args->tokens, B, T, C, s.vocab_begin,
                         s.vocab_begin + s.V_l);
    o.grad_ready(h, pi.wpe);
    o.grad_ready(h, pi.wte);
  } else {
    o.copy(h, args->dinput, g.dres, NC);
  }
  return 0;
}

#undef KEEL_GPT_COMM

}  // namespace keel::gpt
