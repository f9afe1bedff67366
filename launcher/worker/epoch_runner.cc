#include "launcher/worker/epoch_runner.h"

#include <chrono>
#include <optional>

#include "parallel/comm_error.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

int64_t ms_between(std::chrono::steady_clock::time_point a,
                   std::chrono::steady_clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}
int64_t ms_since(std::chrono::steady_clock::time_point a) {
  return ms_between(a, std::chrono::steady_clock::now());
}

}  // namespace

void EpochRunner::join(int epoch, const membership::Rebuild* first) {
  std::optional<membership::Rebuild> rb;
  if (first) rb = *first;
  while (true) {
    epoch_ = epoch;
    const auto t0 = std::chrono::steady_clock::now();
    groups_.begin();
    if (rb) steps_.take_rebuild(*rb);
    if (steps_.before_rendezvous) steps_.before_rendezvous();
    if (recovery_) recovery_->watch(epoch_, [this] { groups_.abort(); });
    try {
      const auto t1 = std::chrono::steady_clock::now();
      groups_.build(steps_.make_groups, steps_.wrap, steps_.rebind);
      const auto t2 = std::chrono::steady_clock::now();
      steps_.load(rb ? &*rb : nullptr);
      if (recovery_ && (rb || epoch_ > 0)) recovery_->mark_restored(epoch_);
      // Where a recovery's time went on this rank, for whoever reads its log after a slow one.
      if (recovery_ && epoch_ > 0)
        LOG(INFO) << "rank " << recovery_->rank() << ": joined epoch " << epoch_ << " in "
                  << ms_since(t0) << " ms (Rebuild taken " << ms_between(t0, t1)
                  << ", communicators " << ms_between(t1, t2) << ", state " << ms_since(t2) << ")";
      return;
    } catch (const CommError& e) {
      if (!recovery_) throw;
      LOG(WARNING) << "rank " << recovery_->rank() << ": epoch " << epoch_
                   << " failed while starting: " << e.what();
      const int64_t done = steps_.steps_done();
      rb = recovery_->fail_and_wait(epoch_, done, done, e.what());
      epoch = epoch_ + 1;
    }
  }
}

void EpochRunner::fail(int64_t step, const std::string& what, const std::function<void()>& settle) {
  KEEL_CHECK(recovery_, "epoch ", epoch_, " failed without a controller to recover it");
  if (groups_.get()) groups_->abort_all();
  if (settle) settle();
  const membership::Rebuild rb = recovery_->fail_and_wait(epoch_, steps_.steps_done(), step, what);
  recovery_->stop_watch();
  join(epoch_ + 1, &rb);
}

}  // namespace keel
