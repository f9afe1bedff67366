// llm.c model checkpoints (gpt2_124M.bin and the like, version 3: fp32): a header of 256
// int32 (magic 20240326, version, max_seq_len, vocab_size, num_layers, num_heads, channels,
// padded_vocab_size) followed by llm.c's 16 parameter tensors, each holding all layers.
// keel reads them into, and writes them from, tensors named as the GPT plugin names its
// parameters ("wte", "h.3.attn.qkv.weight", ...), so a job can start from llm.c weights and
// llm.c can evaluate a keel model.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/plugin.h"
#include "runtime/check.h"  // keel::InputError, which these functions throw

namespace keel {

inline constexpr int32_t kLlmcMagic = 20240326;
inline constexpr int32_t kLlmcVersionFp32 = 3;

struct LlmcHeader {
  int32_t magic = kLlmcMagic;
  int32_t version = kLlmcVersionFp32;
  int32_t max_seq_len = 0;
  int32_t vocab_size = 0;
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t channels = 0;
  int32_t padded_vocab_size = 0;
};

// Full (unsharded) tensors by keel parameter name, row-major.
using NamedTensors = std::map<std::string, std::vector<float>>;

// One tensor as it lies in an llm.c file: its keel name and shape.
struct LlmcTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// Every tensor of a GPT with these dims, in file order: wte, wpe, then each of llm.c's
// per-layer tensors for layers 0..L−1 (ln1w of every layer, then ln1b of every layer, ...),
// then lnf.weight, lnf.bias. Uses num_layers, hidden_size, seq_len, padded_vocab_size.
std::vector<LlmcTensor> llmc_tensor_layout(const keel_model_dims& dims);

// Reads and checks the magic and version of a checkpoint's header; InputError naming the
// file otherwise (a missing file, a short header, version 5 = bf16, ...).
LlmcHeader read_llmc_header(const std::string& path);

// Reads a checkpoint for a job with dims `expect`. Every header field must match the job
// (seq_len, vocab_size, num_layers, num_heads, hidden_size, padded_vocab_size; and
// ffn_hidden_size must be 4·hidden_size, llm.c's only choice), and the file size must be
// exactly what the header implies; otherwise InputError, e.g.
// "gpt2.bin: header channels = 768, config model.hidden_size = 64".
NamedTensors read_llmc_checkpoint(const std::string& path, const keel_model_dims& expect);

// Writes `tensors` (every name of llmc_tensor_layout(dims) with its exact size; a missing,
// mis-sized or unknown tensor is an error naming it) as a version-3 checkpoint, atomically:
// a temporary file is renamed into place, so a crash never leaves half a checkpoint.
void write_llmc_checkpoint(const std::string& path, const keel_model_dims& dims,
                           const NamedTensors& tensors);

}  // namespace keel
