// What the keel-launch tests across machines made of network namespaces share
// (launch_netns_test.cc, failover_torture_test.cc): the fixture that skips without root or
// `ip netns`, a job of one slot per machine (NetJob), and the event-log and leftover checks.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "integration/launch_harness.h"
#include "integration/netns.h"
#include "proto/events.pb.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {

using namespace launch;

class LaunchNetns : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!NetnsLab::available(&why)) GTEST_SKIP() << why;
  }
};

// These run without standbys (recovery.mode = in_place), so detect.on_slot_loss decides
// what follows a lost slot.
//
// A tp 2 × dp 3 job over three namespace machines, one slot (two workers) each: slot 0
// (controller and agent) runs with --slots 3 in machine 0, slots 1 and 2 join from theirs.
class NetJob {
 public:
  // `slots` in all, standbys (--standby in `extra`) included: one per machine of the lab.
  NetJob(NetnsLab* lab, const std::string& dir, const std::vector<std::string>& extra,
         int slots = 3)
      : lab_(lab), dir_(dir), run_dir_(dir + "/runs") {
    cfg_ = job_config(dir, kTp2Dp3);
    sets_ = {"--set", "train.steps=" + std::to_string(kSteps)};
    std::vector<std::string> argv = {
        launch_bin(), "--slots", std::to_string(slots), "--config", cfg_,
        "--run-dir",  run_dir_,  "--workers-per-slot",  "2"};
    argv.insert(argv.end(), sets_.begin(), sets_.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    slot0_ = lab->spawn(0, argv, {"KEEL_IFNAME=" + lab->ifname()}, log(0));
    // The controller's endpoint and the job id, once slot 0 has written them.
    const auto t0 = Clock::now();
    while (seconds_since(t0) < 10) {
      const std::string jd = job_dir_in(run_dir_);
      std::istringstream c(jd.empty() ? "" : slurp(jd + "/controller"));
      if (std::getline(c, endpoint_) && std::getline(c, job_) && !job_.empty()) break;
      std::this_thread::sleep_for(20ms);
    }
    if (job_.empty()) throw std::runtime_error("slot 0 wrote no controller file:\n" + output(0));
    for (int k = 1; k < slots; ++k) join(k);
  }

  // Starts slot k's launcher in machine k, joining the job.
  void join(int k) {
    std::vector<std::string> argv = {
        launch_bin(), "--join", endpoint_,   "--slot", std::to_string(k),    "--job", job_,
        "--config",   cfg_,     "--run-dir", run_dir_, "--workers-per-slot", "2"};
    argv.insert(argv.end(), sets_.begin(), sets_.end());
    lab_->spawn(k, argv, {"KEEL_IFNAME=" + lab_->ifname()}, log(k) + (rejoined_ ? ".2" : ""));
  }
  void set_rejoined() { rejoined_ = true; }

  // Waits for slot 0's launcher (calling `poll` every 20 ms); its exit code, or -1 after
  // timeout_s (it is then killed).
  int wait(const std::function<void()>& poll, int timeout_s) {
    const auto t0 = Clock::now();
    int status = 0;
    while (waitpid(slot0_, &status, WNOHANG) == 0) {
      if (poll) poll();
      if (seconds_since(t0) > timeout_s) {
        kill(-slot0_, SIGKILL);
        waitpid(slot0_, &status, 0);
        return -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string log(int k) const { return dir_ + "/slot" + std::to_string(k) + ".log"; }
  std::string output(int k) const { return slurp(log(k)); }
  const std::string& run_dir() const { return run_dir_; }
  const std::string& job() const { return job_; }

 private:
  NetnsLab* lab_;
  std::string dir_, run_dir_, cfg_, endpoint_, job_;
  std::vector<std::string> sets_;
  pid_t slot0_ = -1;
  bool rejoined_ = false;
};

// Waits up to `timeout` for no process to be left in machine i.
inline testing::AssertionResult machine_empties(const NetnsLab& lab, int i,
                                                std::chrono::seconds timeout = 5s) {
  const auto t0 = Clock::now();
  for (std::vector<pid_t> left = lab.processes_in(i); !left.empty(); left = lab.processes_in(i)) {
    if (Clock::now() - t0 > timeout) {
      // Name what stayed: which process outlived the job says which wait held it.
      testing::AssertionResult r = testing::AssertionFailure();
      r << left.size() << " process(es) left:";
      for (pid_t p : left) {
        std::string cmd = read_text("/proc/" + std::to_string(p) + "/cmdline");
        std::replace(cmd.begin(), cmd.end(), '\0', ' ');
        r << "\n  " << p << " " << cmd;
      }
      return r;
    }
    std::this_thread::sleep_for(20ms);
  }
  return testing::AssertionSuccess();
}

// The "data" object (as JSON) of the first event of `kind` in an events.jsonl text ("" if
// none). Every line must read back as a keel.events.Event.
inline std::string event_data(const std::string& events, const std::string& kind) {
  std::istringstream in(events);
  std::string line;
  while (std::getline(in, line)) {
    events::Event e;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(line, &e).ok()) << line;
    std::string data;
    if (e.kind() == kind && google::protobuf::util::MessageToJsonString(e.data(), &data).ok())
      return data;
  }
  return "";
}

// How many events of `kind` there are.
inline int count_events(const std::string& events, const std::string& kind) {
  std::istringstream in(events);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    events::Event e;
    n += google::protobuf::util::JsonStringToMessage(line, &e).ok() && e.kind() == kind;
  }
  return n;
}

// When the first event of `kind` happened (unix seconds; 0 if none).
inline double event_time(const std::string& events, const std::string& kind) {
  std::istringstream in(events);
  std::string line;
  while (std::getline(in, line)) {
    events::Event e;
    if (google::protobuf::util::JsonStringToMessage(line, &e).ok() && e.kind() == kind)
      return e.t();
  }
  return 0;
}

// The job's shared memory on every machine is gone (what is left is counted, then removed).
inline void expect_no_shm_left(LaunchRun* r) {
  r->leftover_shm = job_shm(r->job);
  EXPECT_TRUE(r->leftover_shm.empty()) << r->leftover_shm[0];
  for (const auto& p : r->leftover_shm) fs::remove(p);
}

}  // namespace keel::test
