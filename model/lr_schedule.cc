#include "model/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace keel {

double learning_rate(const config::OptimConfig& o, int64_t step, int64_t total) {
  const double lr = o.lr();
  if (step < o.warmup_steps()) return lr * double(step + 1) / double(o.warmup_steps());
  if (o.schedule() == config::OptimConfig::constant) return lr;
  const double min_lr = lr * o.min_lr_ratio();
  const int64_t span = std::max<int64_t>(1, total - o.warmup_steps());
  const double ratio = std::min(1.0, double(step - o.warmup_steps()) / double(span));
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (lr - min_lr);
}

}  // namespace keel
