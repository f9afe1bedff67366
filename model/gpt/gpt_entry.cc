// The GPT-2 plugin's table and its one exported symbol. The library is built with hidden
// visibility, so nothing but keel_plugin_entry leaks into the runtime's symbol space and two
// versions of the plugin can be loaded side by side.
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
};

}  // namespace
}  // namespace keel::gpt

extern "C" __attribute__((visibility("default"))) const keel_plugin* keel_plugin_entry(
    uint32_t runtime_abi_version) {
  return runtime_abi_version == KEEL_PLUGIN_ABI_VERSION ? &keel::gpt::kTable : nullptr;
}
