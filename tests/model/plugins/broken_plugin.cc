// Deliberately broken model plugins for tests/model/plugin_broken_test.cc. One source, built
// once per defect (tests/CMakeLists.txt defines exactly one KEEL_BROKEN_* per library):
//   KEEL_BROKEN_BAD_ABI    the table says an abi_version one past the runtime's
//   KEEL_BROKEN_NO_ENTRY   exports keel_plugin_entry_v1 instead of keel_plugin_entry
//   KEEL_BROKEN_BAD_SPLIT  describes a [5, 4] weight as split over TP on dim 0
//   KEEL_BROKEN_NULL_FN    leaves backward NULL
// Apart from its defect each one is a valid plugin with one parameter, so a loader that
// refuses it can only be reacting to that defect.
#include "model/plugin.h"

#include <cstdio>
#include <cstring>

namespace {

int validate(const keel_model_dims*, const keel_stage*, char*, size_t) {
  return 0;
}

int describe_params(const keel_model_dims*, const keel_stage*, keel_param_desc* out, int capacity) {
  if (capacity >= 1) {
    std::memset(out, 0, sizeof(*out));
    std::snprintf(out->name, sizeof(out->name), "w");
    out->ndim = 2;
#ifdef KEEL_BROKEN_BAD_SPLIT
    out->shape[0] = 5;
#else
    out->shape[0] = 8;
#endif
    out->shape[1] = 4;
    out->tp_dim = 0;
    out->tp_blocks = 1;
    out->init = KEEL_INIT_ZEROS;
  }
  return 1;
}

size_t no_floats(const keel_model_dims*, const keel_stage*, int, int) {
  return 0;
}
int run(const keel_model_dims*, const keel_stage*, keel_stage_args*) {
  return 0;
}

double flops(const keel_model_dims*) {
  return 1;
}

const keel_plugin kTable = {
#ifdef KEEL_BROKEN_BAD_ABI
    KEEL_PLUGIN_ABI_VERSION + 1,
#else
    KEEL_PLUGIN_ABI_VERSION,
#endif
    sizeof(keel_plugin),
    "broken",
    "0",
    &validate,
    &describe_params,
    &no_floats,
    &no_floats,
    &run,
#ifdef KEEL_BROKEN_NULL_FN
    nullptr,
#else
    &run,
#endif
    &flops,
    nullptr,  // hf_tensors: no Hugging Face counterpart
    nullptr,  // hf_config
};

}  // namespace

#ifdef KEEL_BROKEN_NO_ENTRY
extern "C" __attribute__((visibility("default"))) const keel_plugin* keel_plugin_entry_v1(
    uint32_t) {
  return &kTable;
}
#else
// Serves any ABI the runtime asks for, so that the loader's own abi_version check is what
// refuses the BAD_ABI build.
extern "C" __attribute__((visibility("default"))) const keel_plugin* keel_plugin_entry(uint32_t) {
  return &kTable;
}
#endif
