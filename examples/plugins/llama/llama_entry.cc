// The Llama plugin's table and its one exported symbol. Built with hidden visibility, so
// nothing but keel_plugin_entry is visible to the runtime.
#include <vector>

#include "examples/plugins/llama/llama_model.h"

namespace llama {
namespace {

size_t activation_floats(const keel_model_dims* dims, const keel_stage* stage, int B, int T) {
  if (validate(dims, stage, nullptr, 0) != 0 || B < 1 || T < 1) return 0;
  return carve_acts(make_shape(*dims, *stage), B, T, nullptr, nullptr);
}

size_t scratch_floats(const keel_model_dims* dims, const keel_stage* stage, int B, int T) {
  if (validate(dims, stage, nullptr, 0) != 0 || B < 1 || T < 1) return 0;
  return carve_scratch(make_shape(*dims, *stage), B, T, nullptr, nullptr);
}

// 6·N + 12·L·C·T, the PaLM accounting: N counts every parameter of the whole model (embedding
// and head both, since they are separate matrices here).
double flops_per_token(const keel_model_dims* dims) {
  const keel_stage whole = {0, 1, 0, 1, 0, dims->num_layers};
  if (validate(dims, &whole, nullptr, 0) != 0) return 0;
  const int n = describe_params(dims, &whole, nullptr, 0);
  std::vector<keel_param_desc> descs(static_cast<size_t>(n));
  describe_params(dims, &whole, descs.data(), n);
  double params = 0;
  for (const auto& d : descs) {
    double numel = 1;
    for (int i = 0; i < d.ndim; ++i) numel *= double(d.shape[i]);
    params += numel;
  }
  return 6.0 * params + 12.0 * dims->num_layers * double(dims->hidden_size) * dims->seq_len;
}

const keel_plugin kTable = {
    KEEL_PLUGIN_ABI_VERSION,
    sizeof(keel_plugin),
    "llama",
    "1.0 (RMSNorm, SwiGLU, RoPE, untied head; Megatron TP)",
    &validate,
    &describe_params,
    &activation_floats,
    &scratch_floats,
    &forward,
    &backward,
    &flops_per_token,
    &hf_tensors,
    &hf_config,
};

}  // namespace
}  // namespace llama

extern "C" __attribute__((visibility("default"))) const keel_plugin* keel_plugin_entry(
    uint32_t runtime_abi_version) {
  return runtime_abi_version == KEEL_PLUGIN_ABI_VERSION ? &llama::kTable : nullptr;
}
