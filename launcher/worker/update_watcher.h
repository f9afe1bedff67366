// A rank's part in hot updates of the model's plugin (keel-ctl update; the controller's part
// is launcher/controller/update_manager.cc). The UpdateWatcher's thread follows the
// controller's plans in the store (update/<n>, report::Update): for each it has the plan's
// plugin checked against the running state, so that a plugin that does not fit is refused
// before anyone switches, answers (update/<n>/check/<rank>, store::UpdateCheck) and waits for
// the controller's decision (update/<n>/apply, store::UpdateDecision): the step before which
// every rank switches. The step loop takes the checked plugin when that step comes.
// Probation holds new code to the loss the job showed before it (robust/update_probation.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "model/plugin_loader.h"
#include "parallel/store.h"
#include "proto/report.pb.h"

namespace keel {

class UpdateWatcher {
 public:
  // Loads a private copy of the plan's plugin and checks it against the running state:
  // returns the copy, or throws what keeps it from fitting.
  using Check = std::function<std::shared_ptr<Plugin>(const report::Update& plan, int rank)>;
  // How often the thread looks for a plan or a decision, and whether it should stop.
  static constexpr std::chrono::milliseconds kPoll{200};

  // `connect` makes the thread's own store client (a TcpStore serialises its calls).
  UpdateWatcher(std::function<std::shared_ptr<Store>()> connect, int rank, Check check);
  ~UpdateWatcher();
  UpdateWatcher(const UpdateWatcher&) = delete;
  UpdateWatcher& operator=(const UpdateWatcher&) = delete;

  // Starts the thread (once; later calls do nothing). Updates asked before this process
  // started are in the plugin it adopted: it follows those numbered from update/count on.
  void start();
  void stop();
  // The rank's id changed (the job shrank or grew its data parallelism).
  void set_rank(int rank) { rank_ = rank; }

  struct Due {
    std::shared_ptr<Plugin> plugin;  // checked against the state when the plan came
    int64_t id = -1;                 // the update's number
  };
  // The plugin to switch to before `step`, once: nullopt when none is due. A rank that got
  // the decision late (it was restoring) switches at once: the controller chose a step ahead
  // of every rank's progress, so this is only ever the same step.
  std::optional<Due> take_due(int64_t step);

 private:
  void loop();
  // Checks plan n and answers; returns the checked plugin (null: refused).
  std::shared_ptr<Plugin> check(Store& s, int64_t n, const report::Update& plan);

  std::function<std::shared_ptr<Store>()> connect_;
  std::atomic<int> rank_;
  Check check_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::shared_ptr<Plugin> next_;   // checked, waiting for its step (mu_)
  int64_t id_ = -1;                // (mu_)
  std::atomic<int64_t> step_{-1};  // switch before this step
};

// The probation of new code after an update (robust/update_probation.h decides): for
// update.probation_steps after it took over, a loss above (1 + update.max_loss_jump) × the
// mean loss of the steps before it fails the job, and the recovery rolls the code back.
class Probation {
 public:
  // The losses before an update it is held to: the newest kRecentLosses steps'.
  static constexpr size_t kRecentLosses = 10;

  Probation(int probation_steps, float max_loss_jump)
      : steps_(probation_steps), max_jump_(max_loss_jump) {}
  // New code took over before `step`.
  void start(int64_t step);
  // New code came with an epoch (a rollback, or a lazy update): judged again only when an
  // update is applied by the step loop.
  void end() { from_ = -1; }
  // Whether new code is on probation at `step`.
  bool on(int64_t step) const;
  // Records step `step`'s global loss; returns why the new code failed (every rank sees the
  // same loss, so every rank returns it alike), nullopt when it did not.
  std::optional<std::string> after_step(int64_t step, double loss);

 private:
  int steps_;
  float max_jump_;
  int64_t from_ = -1;            // the step new code took over at (-1: none)
  std::optional<double> limit_;  // the loss the new code may show on probation
  std::deque<double> recent_;    // the newest kRecentLosses global losses
};

}  // namespace keel
