/* keel model plugin API, version 3.
 *
 * Version 3, appended (struct_size tells; a plugin built before still loads): keel_plugin
 * gained hf_tensors and hf_config, how the model's parameters map to a Hugging Face
 * checkpoint (keel-ckpt export --format hf, model.init_checkpoint of such a directory).
 *
 * Version 3 (from 2): keel_ops gained the kernels of a Llama-style block, appended after
 * grad_ready: rmsnorm_forward/backward, swiglu_forward/backward and rope_forward/backward
 * (examples/plugins/llama/ uses them). The CUDA backend does not implement them yet: there the
 * first call fails with an error naming the op. A version-2 plugin must be rebuilt: the
 * runtime serves one version.
 *
 * Version 2 (from 1): keel_param_desc gained tied_to (ties are declared, not recognised by
 * name) and keel_plugin gained flops_per_token.
 *
 * A plugin is a shared object that exports one C symbol, keel_plugin_entry, returning a
 * versioned table. Through it the plugin (a) describes its parameters for a model config and
 * a (tp, pp) coordinate and (b) runs forward and backward of its pipeline stage for one
 * micro-batch. The runtime owns every byte of state: parameters, gradients, optimizer
 * moments, activations and scratch are allocated by the runtime and passed in. A plugin keeps
 * no state between calls; that is what makes a reload at a step boundary safe.
 *
 * All float pointers are device pointers of the backend the job runs on (host memory on CPU,
 * CUDA memory on GPU). A plugin computes only through the keel_ops table, so one plugin runs
 * on every backend.
 *
 * Errors: functions return 0 on success. An op that communicates (tp_all_reduce,
 * cross_entropy) returns non-zero when the communicator failed; the plugin must then return
 * that value at once, and the runtime raises the typed error it recorded.
 */
#ifndef KEEL_MODEL_PLUGIN_H_
#define KEEL_MODEL_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_PLUGIN_ABI_VERSION 3u
#define KEEL_PLUGIN_ENTRY_SYMBOL "keel_plugin_entry"
#define KEEL_PARAM_NAME_MAX 64
#define KEEL_PARAM_MAX_DIMS 4

/* Model dimensions, from the job config (model.*). */
typedef struct keel_model_dims {
  int32_t num_layers;
  int32_t hidden_size;       /* C */
  int32_t num_heads;         /* NH; head size is C / NH */
  int32_t ffn_hidden_size;   /* 4·C for GPT-2 */
  int32_t seq_len;           /* T, also the number of learned positions */
  int32_t vocab_size;        /* V: real tokens */
  int32_t padded_vocab_size; /* Vp >= V, divisible by tp; rows past V are never targets */
  float init_std;            /* std of normal inits (model.init_std) */
} keel_model_dims;

/* The coordinate this plugin instance serves. Layers [layer_begin, layer_end) of the global
 * stack live on this pipeline stage. Stage 0 holds the embedding, the last stage the final
 * LayerNorm and the head. */
typedef struct keel_stage {
  int32_t tp_rank, tp_size;
  int32_t pp_rank, pp_size;
  int32_t layer_begin, layer_end;
} keel_stage;

typedef enum keel_init {
  KEEL_INIT_ZEROS = 0,
  KEEL_INIT_ONES = 1,
  KEEL_INIT_NORMAL = 2 /* mean 0, std init_std */
} keel_init;

/* Flags of a parameter. */
#define KEEL_PARAM_WEIGHT_DECAY 1u /* AdamW decays it */
/* A copy of a parameter that also lives on the first pipeline stage (the tied embedding used
 * by the head on the last stage). The runtime initialises it identically, all-reduces its
 * gradient over the embedding group and counts it once in norms and checkpoints. */
#define KEEL_PARAM_TIED_COPY 2u

/* One parameter as this (tp, pp) coordinate holds it. The shape is the global shape; if
 * tp_dim >= 0 the runtime holds only this TP rank's shard: dim tp_dim is cut into tp_blocks
 * equal blocks (e.g. 3 for a fused q|k|v weight) and each block is split evenly over TP, so
 * rank r holds rows [r·n/tp, (r+1)·n/tp) of every block, concatenated. */
typedef struct keel_param_desc {
  char name[KEEL_PARAM_NAME_MAX]; /* unique in the model, e.g. "h.3.attn.qkv.weight" */
  int32_t ndim;
  int64_t shape[KEEL_PARAM_MAX_DIMS];
  int32_t tp_dim;    /* -1: replicated over TP */
  int32_t tp_blocks; /* >= 1 */
  int32_t init;      /* keel_init */
  float init_std;
  uint32_t flags;
  /* Non-empty: this parameter and the one of that name on the other end of the pipeline are
   * one weight (a tied embedding: the first stage's table, the last stage's head). Both
   * declare it; the runtime sums the two gradients over the embedding group (first and last
   * stage) before the data-parallel reduction. Empty when pp == 1 (one copy, nothing to tie). */
  char tied_to[KEEL_PARAM_NAME_MAX];
} keel_param_desc;

/* Kernels and collectives the runtime lends a plugin. `impl` is opaque; pass it back as the
 * first argument. Unless a comment says otherwise, gradient outputs ACCUMULATE (+=), so the
 * caller zeroes them once (the runtime zeroes parameter gradients each step and the
 * activation-gradient scratch each call). Shapes: N = B·T rows. */
typedef struct keel_ops {
  uint32_t struct_size;
  void* impl;

  void (*fill)(void* impl, float* x, size_t n, float value);
  void (*copy)(void* impl, float* dst, const float* src, size_t n);
  /* out = a + b (out may alias a or b) */
  void (*add)(void* impl, float* out, const float* a, const float* b, size_t n);

  /* out[b,t,:] = wte_shard[tok - vocab_begin, :] (zero if tok is outside [vocab_begin,
   * vocab_end)) + wpe[t, :] (skipped if wpe is NULL). Overwrites out. */
  void (*embedding_forward)(void* impl, float* out, const int32_t* tokens, const float* wte,
                            const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end);
  /* dwte += (its rows of) Σ dout per token; dwpe += Σ_b dout (skipped if dwpe is NULL). */
  void (*embedding_backward)(void* impl, float* dwte, float* dwpe, const float* dout,
                             const int32_t* tokens, int B, int T, int C, int vocab_begin,
                             int vocab_end);

  /* LayerNorm over the last dim; mean and rstd ([N]) are saved for backward. Overwrites out. */
  void (*layernorm_forward)(void* impl, float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int N, int C);
  void (*layernorm_backward)(void* impl, float* dinp, float* dweight, float* dbias,
                             const float* dout, const float* inp, const float* weight,
                             const float* mean, const float* rstd, int N, int C);

  /* out[N,OC] = inp[N,C] · weight[OC,C]ᵀ + bias[OC] (bias may be NULL). Overwrites out. */
  void (*matmul_forward)(void* impl, float* out, const float* inp, const float* weight,
                         const float* bias, int N, int C, int OC);
  /* dinp += dout·weight; dweight += doutᵀ·inp; dbias += Σ dout (dbias may be NULL). */
  void (*matmul_backward)(void* impl, float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int N, int C, int OC);

  /* Causal self-attention. qkv is [B,T,3,NH,HS] (q|k|v blocks, each NH·HS wide); out is
   * [B,T,NH,HS]; att [B,NH,T,T] saves the softmax for backward. Overwrites out and att. */
  void (*attention_forward)(void* impl, float* out, float* att, const float* qkv, int B, int T,
                            int NH, int HS);
  /* dqkv += ...; scratch holds at least B·NH·T·T floats, and what it holds on entry is
   * ignored (overwritten before it is read). */
  void (*attention_backward)(void* impl, float* dqkv, float* scratch, const float* dout,
                             const float* qkv, const float* att, int B, int T, int NH, int HS);

  /* GELU, tanh form. forward overwrites out; backward accumulates into dinp. */
  void (*gelu_forward)(void* impl, float* out, const float* inp, size_t n);
  void (*gelu_backward)(void* impl, float* dinp, const float* inp, const float* dout, size_t n);

  /* Vocab-parallel softmax cross-entropy: logits [N, V_local] hold columns
   * [vocab_begin, vocab_begin + V_local) of the vocabulary; columns >= vocab_size are padding
   * and excluded. Writes losses[N] (identical on every TP rank) and, if dlogits is not NULL,
   * OVERWRITES dlogits with loss_scale·(softmax − onehot); dlogits may alias logits (the
   * softmax is then computed in place). Never gathers the full logits.
   * Returns non-zero if the TP communicator failed. */
  int (*cross_entropy)(void* impl, float* losses, float* dlogits, const float* logits,
                       const int32_t* targets, int N, int V_local, int vocab_begin, int vocab_size,
                       float loss_scale);

  /* Sum x over the TP group, in place (Megatron's "g" in forward, "f" in backward). Returns
   * non-zero if the communicator failed. */
  int (*tp_all_reduce)(void* impl, float* x, size_t n);

  /* Σ x[i] in a fixed order, returned on the host (e.g. to report a micro-batch's loss). */
  double (*sum)(void* impl, const float* x, size_t n);

  /* Tells the runtime that the gradient of parameter `index` (describe order) is final for
   * this micro-batch, so its data-parallel reduction may start while backward goes on. A
   * plugin that never calls it is correct, only slower. */
  void (*grad_ready)(void* impl, int index);

  /* ---- Version 3. ---- */

  /* RMSNorm over the last dim (eps 1e-5, no mean subtracted, no bias):
   * out = inp·rstd·weight with rstd[n] = 1/sqrt(mean(inp[n,:]²) + eps), saved for backward.
   * Overwrites out and rstd. */
  void (*rmsnorm_forward)(void* impl, float* out, float* rstd, const float* inp,
                          const float* weight, int N, int C);
  /* dinp += ...; dweight += Σ_n dout·inp·rstd. */
  void (*rmsnorm_backward)(void* impl, float* dinp, float* dweight, const float* dout,
                           const float* inp, const float* weight, const float* rstd, int N, int C);

  /* SwiGLU: gate_up is [N, 2F], each row the gate block [F] then the up block [F] (the output
   * of a column-parallel matmul with tp_blocks 2 holds this rank's columns of both blocks in
   * that order); out[N, F] = silu(gate)·up, silu(g) = g·sigmoid(g). Overwrites out. */
  void (*swiglu_forward)(void* impl, float* out, const float* gate_up, int N, int F);
  /* dgate_up [N, 2F] += the gradients of both blocks. */
  void (*swiglu_backward)(void* impl, float* dgate_up, const float* gate_up, const float* dout,
                          int N, int F);

  /* Rotary position embedding, in place on the q and k blocks of qkv [B,T,3,NH,HS] (v is left
   * alone). HS must be even. Within a head, the pairs (x[2i], x[2i+1]) are rotated by the
   * angle t·theta^(-2i/HS) at position t of the sequence (Meta's Llama convention; theta is
   * 10000 there). */
  void (*rope_forward)(void* impl, float* qkv, int B, int T, int NH, int HS, float theta);
  /* The inverse rotation, in place on the q and k blocks of dqkv: turns the gradient of the
   * rotated q, k into that of the unrotated ones. */
  void (*rope_backward)(void* impl, float* dqkv, int B, int T, int NH, int HS, float theta);
} keel_ops;

/* Arguments of one forward or backward call for one micro-batch of B sequences of T tokens.
 * The backward of a micro-batch gets the same tokens, targets, input and activations
 * pointers as its forward, still holding the same values. */
typedef struct keel_stage_args {
  const keel_ops* ops;
  float* const* params; /* this coordinate's parameters, in describe order */
  float* const* grads;  /* their gradients (accumulate) */
  int32_t B, T;
  const int32_t* tokens;  /* [B·T] inputs; read by the first stage */
  const int32_t* targets; /* [B·T]; read by the last stage */
  const float* input;     /* [B,T,C] hidden state from the previous stage (not first) */
  float* output;          /* [B,T,C] hidden state for the next stage (forward, not last) */
  float* activations;     /* activation_floats() floats, kept from forward to backward */
  float* scratch;         /* scratch_floats() floats, valid during one call only */
  const float* dout;      /* backward, not last: gradient of output */
  float* dinput;          /* backward, not first: gradient of input (overwrite) */
  float loss_scale;       /* last stage: d(objective)/d(each token's loss) */
  double loss_sum;        /* forward, last stage: Σ token losses of this micro-batch (out) */
} keel_stage_args;

/* One tensor of a Hugging Face checkpoint (model.safetensors), made of rows of one keel
 * parameter: rows [row_begin, row_end) of its dim 0 (a block of a fused weight, or the real
 * vocabulary of a padded one), the other dims whole. Every row of every parameter must be in
 * exactly one entry, except padded vocabulary rows (zero when imported). */
#define KEEL_HF_NAME_MAX 128
/* Stored transposed, [cols, rows] (2-D only; GPT-2's Conv1D weights). */
#define KEEL_HF_TRANSPOSE 1u
/* The rows are heads of head_rows rows each whose rotary pairs keel interleaves
 * ((x[2i], x[2i+1]), ops.rope_forward); Hugging Face's Llama rotates halves instead, so it
 * stores each head's even rows, then its odd ones. */
#define KEEL_HF_ROPE_HALVES 2u
typedef struct keel_hf_tensor {
  char name[KEEL_HF_NAME_MAX];     /* e.g. "transformer.h.0.attn.c_attn.weight" */
  char param[KEEL_PARAM_NAME_MAX]; /* the keel parameter, e.g. "h.0.attn.qkv.weight" */
  int64_t row_begin, row_end;
  uint32_t flags;    /* KEEL_HF_* */
  int32_t head_rows; /* KEEL_HF_ROPE_HALVES: rows per head (even) */
} keel_hf_tensor;

/* The table a plugin returns. New fields are only ever appended; struct_size tells which. */
typedef struct keel_plugin {
  uint32_t abi_version; /* KEEL_PLUGIN_ABI_VERSION the plugin was built against */
  uint32_t struct_size; /* sizeof(keel_plugin) of that build */
  const char* name;     /* e.g. "gpt2" */
  const char* version;  /* free-form; shown in logs and reports */

  /* Checks that the plugin supports these dims and coordinate; on failure writes a message
   * naming the offending field and value into err and returns non-zero. */
  int (*validate)(const keel_model_dims* dims, const keel_stage* stage, char* err, size_t err_len);
  /* Writes up to `capacity` descriptors and returns how many there are (call with
   * capacity 0 to size the array). */
  int (*describe_params)(const keel_model_dims* dims, const keel_stage* stage, keel_param_desc* out,
                         int capacity);
  size_t (*activation_floats)(const keel_model_dims* dims, const keel_stage* stage, int B, int T);
  size_t (*scratch_floats)(const keel_model_dims* dims, const keel_stage* stage, int B, int T);
  int (*forward)(const keel_model_dims* dims, const keel_stage* stage, keel_stage_args* args);
  int (*backward)(const keel_model_dims* dims, const keel_stage* stage, keel_stage_args* args);
  /* Model FLOPs of forward + backward per token of the whole model (all stages and TP ranks),
   * for MFU: for a GPT, 6·N + 12·L·C·T (the PaLM accounting llm.c uses). */
  double (*flops_per_token)(const keel_model_dims* dims);

  /* ---- Appended in version 3: read only where struct_size covers them; either may be
   * NULL, and then the model has no Hugging Face counterpart. ---- */

  /* The model's Hugging Face tensors for these dims (see keel_hf_tensor), in the order a
   * checkpoint lists them: writes up to `capacity` and returns how many there are (call with
   * capacity 0 to size the array). */
  int (*hf_tensors)(const keel_model_dims* dims, keel_hf_tensor* out, int capacity);
  /* Writes the checkpoint's config.json (architectures, model_type, sizes), NUL-terminated,
   * and returns its length without the NUL: the length needed when out_len is too small. */
  int (*hf_config)(const keel_model_dims* dims, char* out, size_t out_len);
} keel_plugin;

/* The one exported symbol. runtime_abi_version lets a plugin serve several ABI versions;
 * return NULL if it serves none that the runtime asks for. */
typedef const keel_plugin* (*keel_plugin_entry_fn)(uint32_t runtime_abi_version);
const keel_plugin* keel_plugin_entry(uint32_t runtime_abi_version);

#ifdef __cplusplus
}
#endif

#endif /* KEEL_MODEL_PLUGIN_H_ */
