#include "robust/update_probation.h"

namespace keel::update {

bool on_probation(int64_t applied_step, int64_t completed, int probation_steps) {
  return applied_step >= 0 && completed < applied_step + probation_steps;
}

std::optional<double> loss_limit(const std::deque<double>& before, float max_jump) {
  if (before.empty()) return std::nullopt;
  double mean = 0;
  for (double l : before) mean += l / double(before.size());
  if (!(mean > 0)) return std::nullopt;
  return mean * (1.0 + double(max_jump));
}

}  // namespace keel::update
