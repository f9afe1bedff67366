// The probation of a hot update (DESIGN.md, The plugin API): for update.probation_steps after
// new model code took over, a failure of the job, a non-finite loss or a loss jump is blamed on
// the new code and rolls it back. Pure code; launcher/controller/update_manager.cc and
// launcher/worker/update_watcher.cc apply it.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>

namespace keel::update {

// Whether code applied before step `applied_step` (steps completed then) is still on
// probation with `completed` steps done.
bool on_probation(int64_t applied_step, int64_t completed, int probation_steps);

// The highest loss the new code may show on probation: (1 + max_jump) × the mean of the
// losses before the update (nullopt without any, or with a non-positive mean).
std::optional<double> loss_limit(const std::deque<double>& before, float max_jump);

}  // namespace keel::update
