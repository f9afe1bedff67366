// The step loop of a rank with its hooks: what runs before each step, after each step and
// when a step fails. Snapshots, persistent checkpoints, fault injection, progress lines and
// the recovery protocol are all hooks; the loop itself only asks the Trainer for steps until
// the TrainState has done `steps` of them.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include "model/trainer.h"
#include "runtime/check.h"

namespace keel {

// A failure that ends the epoch on every rank though no communicator broke: an SDC check
// found corruption, new code on probation made the loss jump. The recovery protocol (abort,
// ack, rebuild) carries it as it carries a CommError, which means "this communicator is
// broken" and is not one of these.
class RecoverableFailure : public Error {
 public:
  using Error::Error;
};

// Whether `e` ends the epoch and is answered by the recovery protocol: a CommError (a peer or
// a link failed) or a RecoverableFailure.
bool ends_epoch(const std::exception& e);

struct StepHooks {
  std::vector<std::function<void(int64_t step)>> before_step;
  std::vector<std::function<void(const StepStats&)>> after_step;
  // Called with the step that failed and the exception in flight (inside a catch block, so
  // it may rethrow). Returns true when the failure was handled and the loop goes on from
  // the TrainState's step (possibly an earlier one, after a restore); false rethrows.
  std::function<bool(int64_t step, const std::exception& e)> on_error;
};

// Runs steps until trainer().state().step() == steps. A step whose after_step hooks throw
// counts as failed too (its result is already in the state; on_error decides). `trainer` is
// asked for each step: on_error may replace the Trainer (a new layout after the job's data
// parallelism changed).
void run_step_loop(const std::function<Trainer&()>& trainer, int64_t steps, const StepHooks& hooks);

}  // namespace keel
