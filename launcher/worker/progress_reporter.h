// A worker's heartbeat to the controller (control plane, WorkerProgress): every 200 ms and
// after each step, its steps completed, last loss and step time, whether it is waiting
// inside a communicator call, and where each group's collectives stand (their sequence
// numbers). A thread of its own with its own ZeroMQ socket, so a rank whose step is stuck
// still reports, which is what lets the controller tell the stuck rank from the ranks
// waiting for it; and reports that stop (alive_at no longer advancing) mean the whole
// process is stopped (SIGSTOP).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/traced_communicator.h"
#include "proto/control.pb.h"

namespace keel {

class ProgressReporter {
 public:
  ProgressReporter(const std::string& endpoint, int rank, int slot,
                   std::shared_ptr<CommActivity> activity);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // After a step: report it now.
  void step_done(int64_t steps_completed, double loss, double step_s, double compute_s,
                 double comm_s);
  // The rank entered another epoch (its reports carry it; older ones are dropped).
  void set_epoch(int epoch);
  void set_steps(int64_t steps_completed);
  void set_rank(int rank);
  // A new leader controller took over (launcher/worker/leader_link.h): reports go to it from
  // the next one on, on a new connection.
  void set_endpoint(const std::string& endpoint);
  // A fail-slow round completed (launcher/worker/round_meter.h): every report carries it until the
  // next one, or until the epoch changes.
  void set_round(const control::RoundStats& round);
  // An SDC check passed in step `step` (1-based): the progress line says so.
  void sdc_passed(int64_t step);
  // What the rank's communicators are doing, which every report carries (the traced
  // communicators and the fault injector's wrappers record into it).
  const std::shared_ptr<CommActivity>& activity() const { return activity_; }

 private:
  void loop();

  std::string endpoint_;
  std::shared_ptr<CommActivity> activity_;
  std::mutex mu_;
  std::condition_variable cv_;
  control::WorkerProgress p_;
  int epoch_ = 0;
  bool dirty_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace keel
