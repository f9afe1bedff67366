// How the Llama example's parameters map to a Hugging Face LlamaForCausalLM checkpoint: the
// fused q|k|v and gate|up weights split into their blocks, q and k reordered from keel's
// interleaved rotary pairs to Hugging Face's rotated halves, the padded vocabulary rows left
// out, the head untied.
#include <cstdio>

#include "examples/plugins/llama/llama_model.h"

namespace llama {
namespace {

class HfWriter {
 public:
  HfWriter(keel_hf_tensor* out, int capacity) : out_(out), capacity_(capacity) {}
  int count() const { return n_; }
  void add(const char* hf, const char* param, int64_t begin, int64_t rows, uint32_t flags = 0,
           int32_t head_rows = 0) {
    if (out_ && n_ < capacity_) {
      keel_hf_tensor& t = out_[n_];
      t = keel_hf_tensor{};
      std::snprintf(t.name, sizeof(t.name), "%s", hf);
      std::snprintf(t.param, sizeof(t.param), "%s", param);
      t.row_begin = begin;
      t.row_end = begin + rows;
      t.flags = flags;
      t.head_rows = head_rows;
    }
    ++n_;
  }

 private:
  keel_hf_tensor* out_;
  int capacity_;
  int n_ = 0;
};

}  // namespace

int hf_tensors(const keel_model_dims* dims, keel_hf_tensor* out, int capacity) {
  const int64_t C = dims->hidden_size, F = dims->ffn_hidden_size;
  const int32_t HS = dims->num_heads > 0 ? dims->hidden_size / dims->num_heads : 0;
  HfWriter w(out, capacity);
  w.add("model.embed_tokens.weight", "embed.weight", 0, dims->vocab_size);
  char hf[KEEL_HF_NAME_MAX], k[KEEL_PARAM_NAME_MAX];
  auto add = [&](int l, const char* hf_part, const char* keel_part, int64_t begin, int64_t rows,
                 uint32_t flags = 0) {
    std::snprintf(hf, sizeof(hf), "model.layers.%d.%s", l, hf_part);
    std::snprintf(k, sizeof(k), "h.%d.%s", l, keel_part);
    w.add(hf, k, begin, rows, flags, flags ? HS : 0);
  };
  for (int l = 0; l < dims->num_layers; ++l) {
    add(l, "input_layernorm.weight", "attn_norm.weight", 0, C);
    add(l, "self_attn.q_proj.weight", "attn.qkv.weight", 0, C, KEEL_HF_ROPE_HALVES);
    add(l, "self_attn.k_proj.weight", "attn.qkv.weight", C, C, KEEL_HF_ROPE_HALVES);
    add(l, "self_attn.v_proj.weight", "attn.qkv.weight", 2 * C, C);
    add(l, "self_attn.o_proj.weight", "attn.proj.weight", 0, C);
    add(l, "post_attention_layernorm.weight", "mlp_norm.weight", 0, C);
    add(l, "mlp.gate_proj.weight", "mlp.gate_up.weight", 0, F);
    add(l, "mlp.up_proj.weight", "mlp.gate_up.weight", F, F);
    add(l, "mlp.down_proj.weight", "mlp.down.weight", 0, C);
  }
  w.add("model.norm.weight", "norm.weight", 0, C);
  w.add("lm_head.weight", "lm_head.weight", 0, dims->vocab_size);
  return w.count();
}

int hf_config(const keel_model_dims* dims, char* out, size_t out_len) {
  // RMSNorm's epsilon is keel_ops' 1e-5; no biases; one key/value head per query head; plain
  // rotary positions (no rope_scaling). Every field that changes what the model computes is
  // written, so that an import compares it (model/hf_checkpoint.h).
  return std::snprintf(
      out, out_len,
      "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
      "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
      "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
      "  \"num_key_value_heads\": %d,\n  \"max_position_embeddings\": %d,\n"
      "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": %.1f,\n  \"rope_scaling\": null,\n"
      "  \"hidden_act\": \"silu\",\n"
      "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n"
      "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"float32\"\n}\n",
      dims->vocab_size, dims->hidden_size, dims->ffn_hidden_size, dims->num_layers, dims->num_heads,
      dims->num_heads, dims->seq_len, double(kRopeTheta));
}

}  // namespace llama
