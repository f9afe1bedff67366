#include "launcher/worker/update_watcher.h"

#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/update_probation.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {

UpdateWatcher::UpdateWatcher(std::function<std::shared_ptr<Store>()> connect, int rank, Check check)
    : connect_(std::move(connect)), rank_(rank), check_(std::move(check)) {}

UpdateWatcher::~UpdateWatcher() {
  stop();
}

void UpdateWatcher::start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void UpdateWatcher::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void UpdateWatcher::loop() {
  try {
    std::shared_ptr<Store> s = connect_();
    // Updates asked before this process started are in the plugin it adopted.
    int64_t n = s->add(keys::kUpdateCount, 0);
    while (!stop_) {
      std::optional<report::Update> plan;
      try {
        plan = get_message<report::Update>(*s, keys::update_key(n), kPoll);
      } catch (const CommTimeout&) {
        continue;
      }
      if (plan->outcome() == report::refused) {  // the controller refused it: nothing to check
        ++n;
        continue;
      }
      std::shared_ptr<Plugin> next = check(*s, n, *plan);
      std::optional<store::UpdateDecision> decision;
      while (!stop_ && !decision) {
        try {
          decision = get_message<store::UpdateDecision>(*s, keys::update_apply_key(n), kPoll);
        } catch (const CommTimeout&) {
        }
      }
      if (next && decision && decision->has_apply_before_step()) {
        std::lock_guard<std::mutex> l(mu_);
        next_ = std::move(next);
        id_ = n;
        step_ = decision->apply_before_step();
      }
      ++n;
    }
  } catch (const std::exception& e) {
    // The store is the controller's: losing it ends the job anyway.
    LOG(ERROR) << "rank " << rank_ << ": update watcher: " << e.what();
  }
}

std::shared_ptr<Plugin> UpdateWatcher::check(Store& s, int64_t n, const report::Update& plan) {
  const int rank = rank_;
  store::UpdateCheck answer;
  std::shared_ptr<Plugin> next;
  try {
    next = check_(plan, rank);
    answer.set_ok(true);
  } catch (const std::exception& e) {
    answer.set_ok(false);
    answer.set_why(detail::concat("rank ", rank, ": ", e.what()));
    next.reset();
  }
  set_message(s, keys::update_check_key(n, rank), answer);
  return next;
}

std::optional<UpdateWatcher::Due> UpdateWatcher::take_due(int64_t step) {
  const int64_t at = step_;
  if (at < 0 || step < at) return std::nullopt;
  Due d;
  {
    std::lock_guard<std::mutex> l(mu_);
    d.plugin = std::move(next_);
    d.id = id_;
    step_ = -1;
  }
  if (!d.plugin) return std::nullopt;
  return d;
}

void Probation::start(int64_t step) {
  // The loss of the steps before it is what the new code is held to.
  from_ = step;
  limit_ = update::loss_limit(recent_, max_jump_);
}

bool Probation::on(int64_t step) const {
  return update::on_probation(from_, step, steps_);
}

std::optional<std::string> Probation::after_step(int64_t step, double loss) {
  recent_.push_back(loss);
  if (recent_.size() > kRecentLosses) recent_.pop_front();
  if (!on(step) || !limit_ || loss <= *limit_) return std::nullopt;
  return detail::concat("loss ", loss, " at step ", step + 1, " is above ", *limit_,
                        " = (1 + update.max_loss_jump ", max_jump_,
                        ") x the mean loss before the update");
}

}  // namespace keel
