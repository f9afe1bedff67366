// How the GPT plugin's parameters map to a Hugging Face GPT2LMHeadModel checkpoint: the fused
// q|k|v is GPT-2's own c_attn, every linear weight is stored transposed (GPT-2's Conv1D keeps
// [in, out]), the padded vocabulary rows are left out, and the head is tied to wte (not
// stored, as save_pretrained leaves it out).
#include <cstdio>

#include "model/gpt/gpt_model.h"

namespace keel::gpt {
namespace {

// Appends entries while counting them, so one pass both sizes and fills the array.
class HfWriter {
 public:
  HfWriter(keel_hf_tensor* out, int capacity) : out_(out), capacity_(capacity) {}
  int count() const { return n_; }
  void add(const char* hf, const char* param, int64_t rows, uint32_t flags, int64_t begin = 0) {
    if (out_ && n_ < capacity_) {
      keel_hf_tensor& t = out_[n_];
      t = keel_hf_tensor{};
      std::snprintf(t.name, sizeof(t.name), "%s", hf);
      std::snprintf(t.param, sizeof(t.param), "%s", param);
      t.row_begin = begin;
      t.row_end = begin + rows;
      t.flags = flags;
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
  HfWriter w(out, capacity);
  w.add("transformer.wte.weight", "wte", dims->vocab_size, 0);
  w.add("transformer.wpe.weight", "wpe", dims->seq_len, 0);
  char hf[KEEL_HF_NAME_MAX], k[KEEL_PARAM_NAME_MAX];
  struct Map {
    const char *hf, *keel;
    int64_t rows;
    uint32_t flags;
  };
  const Map per_layer[] = {
      {"ln_1.weight", "ln1.weight", C, 0},
      {"ln_1.bias", "ln1.bias", C, 0},
      {"attn.c_attn.weight", "attn.qkv.weight", 3 * C, KEEL_HF_TRANSPOSE},
      {"attn.c_attn.bias", "attn.qkv.bias", 3 * C, 0},
      {"attn.c_proj.weight", "attn.proj.weight", C, KEEL_HF_TRANSPOSE},
      {"attn.c_proj.bias", "attn.proj.bias", C, 0},
      {"ln_2.weight", "ln2.weight", C, 0},
      {"ln_2.bias", "ln2.bias", C, 0},
      {"mlp.c_fc.weight", "mlp.fc.weight", F, KEEL_HF_TRANSPOSE},
      {"mlp.c_fc.bias", "mlp.fc.bias", F, 0},
      {"mlp.c_proj.weight", "mlp.proj.weight", C, KEEL_HF_TRANSPOSE},
      {"mlp.c_proj.bias", "mlp.proj.bias", C, 0},
  };
  for (int l = 0; l < dims->num_layers; ++l)
    for (const Map& m : per_layer) {
      std::snprintf(hf, sizeof(hf), "transformer.h.%d.%s", l, m.hf);
      std::snprintf(k, sizeof(k), "h.%d.%s", l, m.keel);
      w.add(hf, k, m.rows, m.flags);
    }
  w.add("transformer.ln_f.weight", "lnf.weight", C, 0);
  w.add("transformer.ln_f.bias", "lnf.bias", C, 0);
  return w.count();
}

int hf_config(const keel_model_dims* dims, char* out, size_t out_len) {
  // GELU is the tanh form (gelu_new), LayerNorm's epsilon 1e-5, as in llm.c; no dropout;
  // attention scores scaled by 1/sqrt(head size) alone. Every field that changes what the model
  // computes is written, so that an import compares it (model/hf_checkpoint.h).
  return std::snprintf(
      out, out_len,
      "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
      "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n"
      "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": %d,\n"
      "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
      "  \"scale_attn_weights\": true,\n  \"scale_attn_by_inverse_layer_idx\": false,\n"
      "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
      "  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\"\n}\n",
      dims->vocab_size, dims->seq_len, dims->seq_len, dims->hidden_size, dims->num_layers,
      dims->num_heads, dims->ffn_hidden_size);
}

}  // namespace keel::gpt
