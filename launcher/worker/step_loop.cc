#include "launcher/worker/step_loop.h"

#include "parallel/comm_error.h"

namespace keel {

bool ends_epoch(const std::exception& e) {
  return dynamic_cast<const CommError*>(&e) != nullptr ||
         dynamic_cast<const RecoverableFailure*>(&e) != nullptr;
}

void run_step_loop(const std::function<Trainer&()>& trainer, int64_t steps,
                   const StepHooks& hooks) {
  while (trainer().state().step() < steps) {
    const int64_t s = trainer().state().step();
    try {
      for (const auto& h : hooks.before_step) h(s);
      const StepStats st = trainer().step();
      for (const auto& h : hooks.after_step) h(st);
    } catch (const std::exception& e) {
      if (!hooks.on_error || !hooks.on_error(s, e)) throw;
    }
  }
}

}  // namespace keel
