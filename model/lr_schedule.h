// Learning rate at a step: linear warm-up, then constant or cosine decay to
// lr·min_lr_ratio at train.steps (llm.c's schedule).
#pragma once

#include <cstdint>

#include "proto/config.pb.h"

namespace keel {

// `step` is 0-based.
double learning_rate(const config::OptimConfig& optim, int64_t step, int64_t total_steps);

}  // namespace keel
