// Nothing lost to a stray signal or bad numbers: a signal to the supervisor alone stops every
// rank (SIGKILL included, through PR_SET_PDEATHSIG) and, when it can, reports the steps done;
// a later job removes the shared memory a killed one left, and a non-finite loss stops the
// run naming the step.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string long_job(const std::string& dir) {
  std::string cfg = write_config(dir, {{"parallel", "dp: 2 pp: 2"}});
  return "--config " + cfg + " --nproc 4 --set train.steps=100000 --set train.eval_every=0";
}

// Sends `sig` to the supervisor once its ranks have trained for a while.
std::function<void(pid_t)> signal_after(int sig, double seconds, bool* sent) {
  auto start = std::make_shared<Clock::time_point>(Clock::now());
  return [=](pid_t pid) {
    if (!*sent && std::chrono::duration<double>(Clock::now() - *start).count() > seconds) {
      kill(pid, sig);
      *sent = true;
    }
  };
}

TEST(WorkerSignals, SigtermSigintAndSighupStopEveryRankWithAReport) {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    std::string dir = temp_dir("sig");
    bool sent = false;
    JobRun r = run_job(dir, long_job(dir), signal_after(sig, 1.5, &sent), 120);
    ASSERT_TRUE(sent);
    EXPECT_EQ(r.exit_code, 128 + sig) << r.output;
    // The steps done are reported, and the report says it was stopped and why.
    EXPECT_TRUE(contains(r.report, "\"stopped\": true")) << r.output;
    EXPECT_TRUE(contains(r.report, "stopped from outside")) << r.report;
    EXPECT_EQ(r.leftover_processes, 0) << r.output;
    EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
  }
}

TEST(WorkerSignals, SigkillOfTheSupervisorTakesItsRanksAlong) {
  std::string dir = temp_dir("sigkill");
  bool sent = false;
  JobRun r = run_job(dir, long_job(dir), signal_after(SIGKILL, 1.5, &sent), 120);
  ASSERT_TRUE(sent);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  // The harness gives PR_SET_PDEATHSIG a moment, then counts the session's processes.
  EXPECT_EQ(r.leftover_processes, 0) << "ranks outlived their supervisor";
  // A killed supervisor cannot remove its job's shared memory (the harness removed it and
  // says what it found); the next supervisor removes such leftovers itself, which is
  // checked by leaving a fake one of a dead PID behind.
  EXPECT_FALSE(r.leftover_shm.empty());
  const std::string stale = "/dev/shm/keel-999999-0badcafe-r0";
  { std::ofstream(stale) << "x"; }
  std::string dir2 = temp_dir("after-sigkill");
  std::string cfg = write_config(dir2, {{"parallel", "dp: 2"}});
  JobRun next = run_job(dir2, "--config " + cfg + " --nproc 2 --set train.steps=2");
  ASSERT_EQ(next.exit_code, 0) << next.output;
  EXPECT_FALSE(fs::exists(stale)) << next.output;
  EXPECT_TRUE(contains(next.output, "ended job 999999-0badcafe")) << next.output;
}

TEST(WorkerSignals, NonFiniteLossStopsTheRunNamingTheStep) {
  std::string dir = temp_dir("lr");
  std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  JobRun r =
      run_job(dir, "--config " + cfg + " --nproc 2 --set optim.lr=1e10 --set optim.grad_clip=0");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(contains(r.output, "not finite")) << r.output;
  EXPECT_TRUE(contains(r.output, "step ")) << r.output;
  // The job ends with its report all the same: stopped, saying why.
  EXPECT_TRUE(contains(r.report, "\"stopped\": true")) << r.report;
  EXPECT_TRUE(contains(json_string_field(r.report, "stop_reason"), "not finite")) << r.report;
  EXPECT_EQ(r.leftover_processes, 0);
  EXPECT_TRUE(r.leftover_shm.empty());
}

TEST(WorkerSignals, ZeroStepsReportNoLoss) {
  std::string dir = temp_dir("zero");
  std::string cfg = write_config(dir);
  WorkerRun r = run_worker(dir, "--config " + cfg + " --set train.steps=0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 0);
  EXPECT_FALSE(contains(r.report, "final_loss")) << r.report;
}

}  // namespace
}  // namespace keel::test
