// Hugging Face checkpoints in and out: DIR/model.safetensors (fp32 tensors) and
// DIR/config.json, named and shaped as the plugin declares (keel_plugin.hf_tensors and
// hf_config in model/plugin.h), so that `transformers` loads an export as GPT2LMHeadModel or
// LlamaForCausalLM, and a job starts from such a directory (model.init_checkpoint).
// safetensors is written and read directly: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}}, then the tensors' bytes.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "model/llmc_checkpoint.h"  // NamedTensors
#include "model/plugin.h"
#include "model/plugin_loader.h"

namespace keel {

// Whether `path` is a directory holding model.safetensors.
bool is_hf_checkpoint(const std::string& path);

// model.init_checkpoint = `path`, a directory that is no Hugging Face checkpoint: throws the
// InputError that says what it lacks, or, for a keel checkpoint (checkpoint.dir or one step's
// directory), that --resume is the way in. Does nothing for any other path (an llm.c file).
void refuse_directory_without_weights(const std::string& path);

// Writes a Hugging Face checkpoint into `dir` (created if missing), one keel tensor at a time
// so that host memory holds one tensor: add() each of `params` (the single-rank table) in
// order, then finish(). Files appear only at finish() (written as .tmp, then renamed).
// Throws InputError where the plugin's names do not cover its parameters (naming both).
class HfExport {
 public:
  HfExport(std::string dir, const Plugin& plugin, const keel_model_dims& dims,
           std::vector<keel_param_desc> params);
  ~HfExport();
  HfExport(const HfExport&) = delete;
  HfExport& operator=(const HfExport&) = delete;

  // `full`: parameter `d` as a whole row-major tensor; the next of `params`.
  void add(const keel_param_desc& d, const std::vector<float>& full);
  void finish();

 private:
  std::string dir_;
  std::string config_;
  std::vector<keel_param_desc> params_;
  std::vector<keel_hf_tensor> tensors_;
  size_t next_ = 0;  // index into params_
  std::FILE* out_ = nullptr;
};

// Reads a Hugging Face checkpoint for a model of `params` (the single-rank table) into full
// keel tensors (padded vocabulary rows zero). Names are matched as the plugin declares them,
// or without their first component ("transformer.", "model."), as some files store them.
// F32, F16 and BF16 tensors are read. Throws InputError naming the file and the first tensor
// whose name or shape does not fit, e.g.
//   "DIR/model.safetensors: tensor 'transformer.h.0.attn.c_attn.weight' has shape [64, 96],
//    this model needs [64, 192] (for h.0.attn.qkv.weight)"
NamedTensors read_hf_checkpoint(const std::string& dir, const Plugin& plugin,
                                const keel_model_dims& dims,
                                const std::vector<keel_param_desc>& params);

}  // namespace keel
