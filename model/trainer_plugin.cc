// Replacing the model's code under a live state (DESIGN.md, The plugin API): the plugin owns
// no state, so another build of it can take over between two steps if it describes the same
// parameters; the Trainer keeps the state, the communicators and the step.
#include <cstring>

#include "model/trainer.h"
#include "model/trainer_slot.h"
#include "runtime/check.h"

namespace keel {

void Trainer::replace_plugin(std::shared_ptr<Plugin> next) {
  KEEL_CHECK(next != nullptr, "replace_plugin: no plugin");
  // describe() runs the new plugin's own validation of this config and coordinate first.
  const std::vector<keel_param_desc> descs = next->describe(dims_, stage_);
  std::vector<keel_param_desc> running;
  for (const ParamSlot& s : state_->params().slots()) running.push_back(s.desc);
  if (const std::string diff = first_param_difference(running, descs); !diff.empty())
    throw InputError(detail::concat("plugin ", next->path(), " (", next->name(), " ",
                                    next->version(), ") does not fit the running state: ", diff));
  const int B = cfg_.train().micro_batch_size(), T = dims_.seq_len;
  const size_t act = std::max<size_t>(next->table().activation_floats(&dims_, &stage_, B, T), 1);
  const size_t scratch = std::max<size_t>(next->table().scratch_floats(&dims_, &stage_, B, T), 1);
  // Buffers only grow: between steps nothing in them is live (the next forward rewrites them).
  if (act > act_floats_) {
    for (auto& slot : slots_) {
      backend_->free(slot->activations);
      slot->activations = static_cast<float*>(backend_->alloc(act * sizeof(float)));
    }
    act_floats_ = act;
  }
  if (scratch > scratch_floats_) {
    backend_->free(scratch_);
    scratch_ = static_cast<float*>(backend_->alloc(scratch * sizeof(float)));
    scratch_floats_ = scratch;
  }
  plugin_ = std::move(next);
}

}  // namespace keel
