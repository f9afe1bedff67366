#include "launcher/worker/progress_reporter.h"

#include <unistd.h>

#include <chrono>

#include "launcher/control_plane.h"
#include "launcher/recovery_protocol.h"
#include "parallel/peer_auth.h"

namespace keel {
namespace {

// The longest a report waits for news: the controller reads a silent rank as hung or lost
// after detect.* timeouts of seconds, so a report five times a second keeps it alive with
// room to spare, while a step that ends sends at once.
constexpr std::chrono::milliseconds kReportEvery{200};

}  // namespace

using recovery::unix_now;

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
  p_.clear_round();  // the old epoch's: the controller starts the new one afresh
  dirty_ = true;
}

void ProgressReporter::sdc_passed(int64_t step) {
  std::lock_guard<std::mutex> l(mu_);
  p_.set_sdc_passed_step(step);
}

void ProgressReporter::set_round(const control::RoundStats& round) {
  std::lock_guard<std::mutex> l(mu_);
  *p_.mutable_round() = round;
}

void ProgressReporter::set_rank(int rank) {
  std::lock_guard<std::mutex> l(mu_);
  p_.set_rank(rank);
}

void ProgressReporter::set_steps(int64_t steps_completed) {
  std::lock_guard<std::mutex> l(mu_);
  p_.set_step(steps_completed);
}

void ProgressReporter::set_endpoint(const std::string& endpoint) {
  std::lock_guard<std::mutex> l(mu_);
  endpoint_ = endpoint;
  dirty_ = true;
  cv_.notify_one();
}

void ProgressReporter::loop() {
  std::unique_lock<std::mutex> l(mu_);
  std::string connected = endpoint_;
  auto client = std::make_unique<ControlClient>(
      connected, "worker/" + std::to_string(p_.rank()) + "/" + std::to_string(getpid()));
  while (!stop_) {
    cv_.wait_for(l, kReportEvery, [this] { return stop_ || dirty_; });
    if (stop_) break;
    if (endpoint_ != connected) {
      connected = endpoint_;
      client = std::make_unique<ControlClient>(
          connected, "worker/" + std::to_string(p_.rank()) + "/" + std::to_string(getpid()));
    }
    dirty_ = false;
    control::Envelope e = make_envelope(epoch_);
    *e.mutable_progress() = p_;
    control::WorkerProgress* p = e.mutable_progress();
    if (activity_) {
      p->set_in_collective(activity_->in_call());
      p->set_in_collective_since(activity_->since());
      for (const GroupSeq& g : activity_->groups()) {
        control::GroupSeq* out = p->add_groups();
        out->set_group(comm_group_name(g.group));
        out->set_entered(g.entered);
        out->set_finished(g.finished);
        out->set_since(g.since);
      }
    }
    // Stamped here, on this thread: it is the liveness signal, alive while the main thread
    // is stuck and silent only when the whole process is stopped.
    p->set_alive_at(unix_now());
    p->set_refusals(auth_refusals());
    l.unlock();
    client->send(e);
    l.lock();
  }
}

}  // namespace keel
