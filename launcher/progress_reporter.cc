#include "launcher/progress_reporter.h"

#include <unistd.h>

#include <chrono>

#include "launcher/control_plane.h"

namespace keel {

ProgressReporter::ProgressReporter(const std::string& endpoint, int rank, int slot,
                                   std::shared_ptr<CommActivity> activity)
    : endpoint_(endpoint), activity_(std::move(activity)) {
  p_.set_rank(rank);
  p_.set_slot(slot);
  p_.set_pid(int(getpid()));
  thread_ = std::thread([this] { loop(); });
}

ProgressReporter::~ProgressReporter() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressReporter::step_done(int64_t steps_completed, double loss, double step_s,
                                 double compute_s, double comm_s) {
  {
    std::lock_guard<std::mutex> l(mu_);
    p_.set_step(steps_completed);
    p_.set_loss(loss);
    p_.set_step_s(step_s);
    p_.set_compute_s(compute_s);
    p_.set_comm_s(comm_s);
    dirty_ = true;
  }
  cv_.notify_all();
}

void ProgressReporter::set_epoch(int epoch) {
  std::lock_guard<std::mutex> l(mu_);
  epoch_ = epoch;
  dirty_ = true;
}

void ProgressReporter::set_rank(int rank) {
  std::lock_guard<std::mutex> l(mu_);
  p_.set_rank(rank);
}

void ProgressReporter::set_steps(int64_t steps_completed) {
  std::lock_guard<std::mutex> l(mu_);
  p_.set_step(steps_completed);
}

void ProgressReporter::loop() {
  ControlClient client(endpoint_,
                       "worker/" + std::to_string(p_.rank()) + "/" + std::to_string(getpid()));
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, std::chrono::milliseconds(200), [this] { return stop_ || dirty_; });
    if (stop_) break;
    dirty_ = false;
    control::Envelope e = make_envelope(epoch_);
    *e.mutable_progress() = p_;
    e.mutable_progress()->set_in_collective(activity_ && activity_->in_call());
    e.mutable_progress()->set_in_collective_since(activity_ ? activity_->since.load() : 0);
    l.unlock();
    client.send(e);
    l.lock();
  }
}

}  // namespace keel
