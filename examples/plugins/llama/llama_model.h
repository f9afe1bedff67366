// Internals of the Llama example plugin shared by its files: the local sizes of one (tp, pp)
// coordinate, where each parameter sits in describe order, and the layout of the activation
// and scratch buffers the runtime lends. The plugin includes nothing of keel but
// model/plugin.h: it is what a model written outside keel looks like.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/plugin.h"

namespace llama {

// RoPE's base (Llama 1 and 2). keel_model_dims has no field for it; a model that wants
// another base would make it a constant of its own build, as here.
constexpr float kRopeTheta = 10000.0f;

// Sizes as this coordinate sees them; *_l fields are the TP-local share.
struct Shape {
  int L, C, NH, HS, F, T, V, Vp;
  int tp, tp_rank;
  int NH_l, C_l, F_l, V_l;
  int vocab_begin;
  int layer_begin, num_local_layers;
  bool first, last;
};

int validate(const keel_model_dims* dims, const keel_stage* stage, char* err, size_t err_len);
// Hugging Face LlamaForCausalLM names and config.json (llama_hf.cc; model/plugin.h).
int hf_tensors(const keel_model_dims* dims, keel_hf_tensor* out, int capacity);
int hf_config(const keel_model_dims* dims, char* out, size_t out_len);
Shape make_shape(const keel_model_dims& dims, const keel_stage& stage);

// Per-layer parameters, in describe order. No biases anywhere (Llama has none).
enum LayerParam { kAttnNorm, kQkv, kAttnProj, kMlpNorm, kGateUp, kDown, kLayerParams };

// Indices into keel_stage_args::params/grads; -1 where absent on this stage.
struct ParamIndex {
  int embed = -1;  // stage 0
  int layers = 0;
  int norm = -1, lm_head = -1;  // last stage
  int count = 0;
  int layer(int local_layer, LayerParam p) const { return layers + local_layer * kLayerParams + p; }
};
ParamIndex param_index(const Shape& s);

int describe_params(const keel_model_dims* dims, const keel_stage* stage, keel_param_desc* out,
                    int capacity);

// What forward keeps for backward, per layer (N = B·T rows).
struct LayerActs {
  float *n1, *n1_rstd;  // attention RMSNorm output [N,C] and its rstd [N]
  float* qkv;           // [N, 3·C_l], q and k rotated
  float* atty;          // [N, C_l]
  float* att;           // [B, NH_l, T, T]
  float* res2;          // [N,C] x + attn.proj(atty)
  float *n2, *n2_rstd;  // MLP RMSNorm
  float* gate_up;       // [N, 2·F_l]: this rank's gate columns, then its up columns
  float* h;             // [N, F_l] silu(gate)·up
  float* res3;          // [N,C] the layer's output
};
struct Acts {
  float* x0;  // [N,C] stage 0: the embedding
  float* layers;
  size_t layer_floats;
  float *nf, *nf_rstd;  // last stage: final RMSNorm
  float* logits;        // [N, V_l], dlogits after forward
  LayerActs layer(const Shape& s, int B, int T, int local_layer) const;
};
size_t carve_acts(const Shape& s, int B, int T, float* base, Acts* out);

// Scratch: the per-token losses in forward, the activation gradients in backward.
struct Grads {
  float* dres;                    // [N,C] gradient of the residual stream
  float* dn;                      // [N,C] gradient of an RMSNorm output
  float *dh, *dgate_up;           // MLP: [N, F_l], [N, 2·F_l]
  float *datty, *dqkv, *att_tmp;  // attention (shares the MLP's region)
  float* losses;                  // forward: [N], aliases dres
};
size_t carve_scratch(const Shape& s, int B, int T, float* base, Grads* out);

int forward(const keel_model_dims* dims, const keel_stage* stage, keel_stage_args* args);
int backward(const keel_model_dims* dims, const keel_stage* stage, keel_stage_args* args);

constexpr int kBadArgs = -1;

}  // namespace llama
