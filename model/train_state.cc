#include "model/train_state.h"

#include <cstring>

namespace keel {
namespace {

uint64_t fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

TrainState::TrainState(Backend* backend, std::vector<keel_param_desc> descs, int tp_rank,
                       int tp_size, int dp_size, bool zero1)
    : backend_(backend), params_(backend, std::move(descs), tp_rank, tp_size, dp_size) {
  moment_floats_ =
      zero1 && dp_size > 1 ? params_.padded_numel() / size_t(dp_size) : params_.padded_numel();
  params_.allocate_moments(moment_floats_);
}

std::vector<StateSpan> TrainState::spans() {
  return {{"params", params_.params(), params_.padded_numel()},
          {"adam_m", params_.m(), moment_floats_},
          {"adam_v", params_.v(), moment_floats_}};
}

size_t TrainState::bytes() const {
  return (params_.padded_numel() + 2 * moment_floats_) * sizeof(float);
}

uint64_t TrainState::layout_fingerprint() const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const ParamSlot& s : params_.slots()) {
    h = fnv(h, s.name.data(), s.name.size());
    for (int64_t d : s.local_shape) h = fnv(h, &d, sizeof(d));
    h = fnv(h, &s.desc.tp_dim, sizeof(s.desc.tp_dim));
    h = fnv(h, &s.desc.flags, sizeof(s.desc.flags));
    h = fnv(h, &s.offset, sizeof(s.offset));
  }
  const size_t sizes[2] = {params_.padded_numel(), moment_floats_};
  return fnv(h, sizes, sizeof(sizes));
}

}  // namespace keel
