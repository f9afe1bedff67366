// The GPT-2 plugin's table and its one exported symbol. The library is built with hidden
// visibility, so nothing but keel_plugin_entry leaks into the runtime's symbol space and two
// versions of the plugin can be loaded side by side.
#include <vector>

#include "model/gpt/gpt_model.h"

namespace keel::gpt {
namespace {

size_t activation_floats(const keel_model_dims* dims, const keel_stage* stage, int B, int T) {
  if (validate(dims, stage, nullptr, 0) != 0 || B < 1 || T < 1) return 0;
  return carve_acts(make_shape(*dims, *stage), B, T, nullptr, nullptr);
}

size_t scratch_floats(const keel_model_dims* dims, const keel_stage* stage, int B, int T) {
  if (validate(dims, stage, nullptr, 0) != 0 || B < 1 || T < 1) return 0;
  return carve_scratch(make_shape(*dims, *stage), B, T, nullptr, nullptr);
}

// 6·N + 12·L·C·T: 6 FLOPs per parameter per token (forward 2, backward 4) plus attention's
// QKᵀ and AV, which no parameter counts. N counts the real model: the padded vocabulary rows
// are counted too, as llm.c does, since the GEMMs compute them.
double flops_per_token(const keel_model_dims* dims) {
  const keel_stage whole = {0, 1, 0, 1, 0, dims->num_layers};
  if (validate(dims, &whole, nullptr, 0) != 0) return 0;
  const int n = describe_params(dims, &whole, nullptr, 0);
  std::vector<keel_param_desc> descs(size_t(n > 0 ? n : 0));
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
    "gpt2",
    "1.0 (llm.c GPT-2, Megatron TP)",
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
}  // namespace keel::gpt

extern "C" __attribute__((visibility("default"))) const keel_plugin* keel_plugin_entry(
    uint32_t runtime_abi_version) {
  return runtime_abi_version == KEEL_PLUGIN_ABI_VERSION ? &keel::gpt::kTable : nullptr;
}
