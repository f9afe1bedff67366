// Internals of the GPT-2 plugin shared by its files: the local sizes of one (tp, pp)
// coordinate, where each parameter sits in describe order, and the layout of the activation
// and scratch buffers the runtime lends to forward and backward.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/plugin.h"

namespace keel::gpt {

// Sizes as this coordinate sees them; *_l fields are the TP-local share.
struct Shape {
  int L, C, NH, HS, F, T, V, Vp;  // global dims (T: learned positions)
  int tp, tp_rank;
  int NH_l, C_l, F_l, V_l;  // local heads, attention width, MLP width, vocab rows
  int vocab_begin;          // first vocab row of this rank's wte shard
  int layer_begin, num_local_layers;
  bool first, last;
  bool head_copy;  // the last stage holds its own tied copy of wte (pp > 1)
};

// Fills *err (if err_len > 0) and returns non-zero when the plugin cannot serve this config.
int validate(const keel_model_dims* dims, const keel_stage* stage, char* err, size_t err_len);
// Only meaningful for a validated config.
Shape make_shape(const keel_model_dims& dims, const keel_stage& stage);

// Per-layer parameters, in describe order.
enum LayerParam {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kMlpProjW,
  kMlpProjB,
  kLayerParams
};

// Indices into keel_stage_args::params/grads (describe order); -1 where absent.
struct ParamIndex {
  int wte = -1, wpe = -1;  // stage 0
  int layers = 0;          // first parameter of the first local layer
  int lnf_w = -1, lnf_b = -1;
  int head_wte = -1;  // the wte the head multiplies with: the tied copy, or wte when pp == 1
  int count = 0;
  int layer(int local_layer, LayerParam p) const { return layers + local_layer * kLayerParams + p; }
};
ParamIndex param_index(const Shape& s);

// Hugging Face GPT2LMHeadModel names and config.json (gpt_hf.cc; model/plugin.h).
int hf_tensors(const keel_model_dims* dims, keel_hf_tensor* out, int capacity);
int hf_config(const keel_model_dims* dims, char* out, size_t out_len);

int describe_params(const keel_model_dims* dims, const keel_stage* stage, keel_param_desc* out,
                    int capacity);

// What forward keeps for backward, llm.c's activation list cut to what backward reads.
struct LayerActs {
  float *ln1, *ln1_mean, *ln1_rstd;  // ln1 output [N,C], its mean and rstd [N]
  float* qkv;                        // [N, 3·C_l]: this rank's heads' q|k|v
  float* atty;                       // [N, C_l] attention output
  float* att;                        // [B, NH_l, T, T] softmax
  float* res2;                       // [N,C] x + attn.proj(atty)
  float *ln2, *ln2_mean, *ln2_rstd;
  float* fch;       // [N, F_l] fc output, pre-GELU
  float* fch_gelu;  // [N, F_l]
  float* res3;      // [N,C] res2 + mlp.proj(fch_gelu): the layer's output
};
struct Acts {
  float* x0;  // [N,C] stage 0: the embedding, the first layer's input
  float* layers;
  size_t layer_floats;
  float *lnf, *lnf_mean, *lnf_rstd;  // last stage
  float* logits;                     // [N, V_l] logits, then dlogits in place
  LayerActs layer(const Shape& s, int B, int T, int local_layer) const;
};
// Carves `base` into the activation layout; with base == nullptr, only sizes it.
// Returns the floats used.
size_t carve_acts(const Shape& s, int B, int T, float* base, Acts* out);

// Scratch: forward uses it for the per-token losses; backward for the activation gradients.
struct Grads {
  float* dres;  // [N,C] gradient of the residual stream, accumulated through the layers
  float* dln;   // [N,C] gradient of a LayerNorm output (ln1, ln2 or lnf)
  // The MLP and attention gradients are never live at once, so they share one region.
  float *dfch_gelu, *dfch;        // [N, F_l] each
  float *datty, *dqkv, *att_tmp;  // [N, C_l], [N, 3·C_l], [B, NH_l, T, T]
  float* losses;                  // forward only: [N], aliases dres
};
size_t carve_scratch(const Shape& s, int B, int T, float* base, Grads* out);

int forward(const keel_model_dims* dims, const keel_stage* stage, keel_stage_args* args);
int backward(const keel_model_dims* dims, const keel_stage* stage, keel_stage_args* args);

// Returned for a call whose arguments cannot be right (missing pointers, T > seq_len); the
// runtime has then recorded no communication failure.
constexpr int kBadArgs = -1;

}  // namespace keel::gpt
