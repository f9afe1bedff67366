// Joins and keel-ctl requests a running job refuses (issue 18, items 2, 6 and 11): a
// keel-launch --join with a wrong job id, a slot out of range, a slot in use or slot 0 gets
// the controller's reason and exits 2 at once, leaving nothing behind and the job training
// on; keel-ctl inject at a step the job has passed is refused naming the rank's step; and
// every keel-launch or keel-ctl error carries its program's prefix exactly once.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "parallel/job_key.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

using Clock = std::chrono::steady_clock;

struct Bounded {
  int exit_code = -1;  // -1: still running at the deadline (then killed)
  std::string output;  // stdout and stderr
  double seconds = 0;
  size_t leftovers = 0;  // processes of its session alive after it ended
};

// Runs `cmd` in a session of its own and waits for it up to `deadline_s`.
Bounded run_bounded(const std::string& cmd, const std::string& log, int deadline_s) {
  Bounded b;
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setsid();
    execl("/bin/sh", "sh", "-c", ("exec " + cmd + " > " + log + " 2>&1").c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() - t0 > std::chrono::seconds(deadline_s)) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      status = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  b.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (status != -1) b.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  b.leftovers = session_processes(pid).size();
  kill(-pid, SIGKILL);  // nothing, unless the check above failed
  std::ifstream in(log);
  b.output.assign(std::istreambuf_iterator<char>(in), {});
  return b;
}

int count_of(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The joins are tried while a 2-slot job trains (rank 0 paced to at least 10 ms a step so
// that it is still training; it is stopped with SIGINT once every check is done). Each must
// be answered well within the joiner's register timeout (10 s), which would otherwise end it
// with "cannot reach the controller".
TEST(JoinErrors, RefusedJoinsExitTwoWithTheReasonAndTheJobTrainsOn) {
  const std::string dir = temp_dir("join-errors");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  struct Case {
    std::string name, args, want;
  };
  std::vector<Case> cases;
  std::vector<Bounded> joins;
  Bounded inject, wrong_secret, replay;
  std::string status_before, status_after;
  int step_before = -1, step_after = -1;
  bool done = false, stopped = false;
  JobRun r = run_launch_job(
      dir,
      "--config " + cfg +
          " --local 2 --set train.steps=5000 --set detect.slow_round_steps=0"
          " --fault slow@step=0,rank=0,delay_ms=10",
      [&](pid_t launcher) {
        if (done) {
          if (!stopped) kill(launcher, SIGINT);
          stopped = true;
          return;
        }
        const std::string job_dir = launched_job_dir(dir);
        if (job_dir.empty() || launched_job_step(job_dir) < 2) return;
        std::istringstream c(slurp(job_dir + "/controller"));
        std::string endpoint, job;
        std::getline(c, endpoint);
        std::getline(c, job);
        const std::string other_secret = dir + "/another-jobs-secret";
        JobKey::generate().save(other_secret);
        // The job's secret given, so that what is refused is the join itself.
        const std::string join = bin_dir() + "/keel-launch --join " + endpoint + " --config " +
                                 cfg + " --run-dir " + dir + "/runs --secret-file " + job_dir +
                                 "/secret";
        cases = {
            {"wrong job", join + " --slot 1 --job 1-nosuchjob",
             "job id '1-nosuchjob' is not this controller's job (" + job + ")"},
            {"out of range", join + " --slot 7 --job " + job,
             "slot 7 is out of range: the job has slots 0..1"},
            {"in use", join + " --slot 1 --job " + job, "slot 1 is in use: keel-launch pid "},
            // Slot 0 is a slot like any other: its controller runs in a process of its own.
            {"slot 0 in use", join + " --slot 0 --job " + job,
             "slot 0 is in use: keel-launch pid "},
        };
        // Another job's secret: said as such at once (issue 43), not "cannot reach".
        wrong_secret = run_bounded(bin_dir() + "/keel-launch --join " + endpoint + " --config " +
                                       cfg + " --run-dir " + dir + "/runs --secret-file " +
                                       other_secret + " --slot 1 --job " + job,
                                   dir + "/join-wrong-secret.log", 8);
        step_before = launched_job_step(job_dir);
        for (size_t i = 0; i < cases.size(); ++i)
          joins.push_back(
              run_bounded(cases[i].args, dir + "/join" + std::to_string(i) + ".log", 8));
        // A replay needs three groups of machines; this job has two: refused before any rank
        // is aborted (issue 43), and the job trains on in the same epoch.
        replay =
            run_bounded(bin_dir() + "/keel-ctl replay --run " + job_dir, dir + "/replay.log", 8);
        // Step 0 has passed for every rank once the job reports 2 steps done.
        inject = run_bounded(bin_dir() + "/keel-ctl inject crash@step=0,rank=1 --run " + job_dir,
                             dir + "/inject.log", 8);
        // The job goes on, slot 1 still its own: wait (with a deadline) for a step past the
        // one before the joins.
        const auto t0 = Clock::now();
        while ((step_after = launched_job_step(job_dir)) <= step_before + 1 &&
               Clock::now() - t0 < std::chrono::seconds(20))
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        status_after =
            run_bounded(bin_dir() + "/keel-ctl status --run " + job_dir, dir + "/status.log", 8)
                .output;
        done = true;
      },
      240);
  ASSERT_TRUE(done) << r.output;
  ASSERT_EQ(joins.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Bounded& j = joins[i];
    SCOPED_TRACE(cases[i].name + ": " + cases[i].args);
    // Refused by itself: a join still running at run_bounded's deadline is killed, with no
    // exit code (-1).
    EXPECT_EQ(j.exit_code, 2) << j.output;
    EXPECT_TRUE(contains(j.output, "refused slot")) << j.output;
    EXPECT_TRUE(contains(j.output, cases[i].want)) << j.output;
    EXPECT_EQ(count_of(j.output, "keel-launch: error: "), 1) << j.output;
    EXPECT_FALSE(contains(j.output, "cannot reach")) << j.output;
    EXPECT_EQ(j.leftovers, 0u) << j.output;
  }
  EXPECT_EQ(replay.exit_code, 2) << replay.output;
  EXPECT_TRUE(contains(replay.output, "a replay needs three groups")) << replay.output;
  EXPECT_FALSE(contains(r.output, "aborted")) << r.output;
  EXPECT_EQ(wrong_secret.exit_code, 2) << wrong_secret.output;
  EXPECT_TRUE(contains(wrong_secret.output, "refused this slot's handshake"))
      << wrong_secret.output;
  EXPECT_TRUE(contains(wrong_secret.output, "the job's secret is not this one's"))
      << wrong_secret.output;
  EXPECT_FALSE(contains(wrong_secret.output, "cannot reach")) << wrong_secret.output;
  EXPECT_EQ(wrong_secret.leftovers, 0u) << wrong_secret.output;
  // The controller says each refusal too.
  EXPECT_EQ(count_of(r.output, "] refused keel-launch --join"), int(cases.size())) << r.output;

  EXPECT_EQ(inject.exit_code, 2) << inject.output;
  EXPECT_TRUE(contains(inject.output,
                       "keel-ctl: error: crash@step=0,rank=1: step 0 has passed: rank 1 has "
                       "completed "))
      << inject.output;
  EXPECT_TRUE(contains(inject.output, "give step=")) << inject.output;
  EXPECT_EQ(count_of(inject.output, "keel-ctl"), 1) << inject.output;

  EXPECT_GT(step_after, step_before + 1) << status_after;
  EXPECT_TRUE(contains(status_after, "state training")) << status_after;
  EXPECT_TRUE(contains(status_after, "slot  1  active")) << status_after;
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  EXPECT_FALSE(contains(r.output, "crash")) << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// A future step is taken, and the fault fires: the rule refuses only what has passed.
TEST(JoinErrors, InjectAtAFutureStepIsTakenAndFires) {
  const std::string dir = temp_dir("inject-future");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  Bounded inject;
  int at = -1;
  JobRun r = run_launch_job(
      dir,
      "--config " + cfg +
          " --local 2 --set train.steps=200 --set detect.slow_round_steps=0"
          " --fault slow@step=0,rank=0,delay_ms=20",
      [&](pid_t) {
        if (at >= 0) return;
        const std::string job_dir = launched_job_dir(dir);
        const int step = launched_job_step(job_dir);
        if (step < 2) return;
        at = step + 15;
        inject = run_bounded(bin_dir() + "/keel-ctl inject crash@step=" + std::to_string(at) +
                                 ",rank=1 --run " + job_dir,
                             dir + "/inject.log", 8);
      },
      240);
  ASSERT_GE(at, 0) << r.output;
  EXPECT_EQ(inject.exit_code, 0) << inject.output;
  EXPECT_TRUE(contains(inject.output, "injected crash@step=" + std::to_string(at) + ",rank=1"))
      << inject.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "kind"), "crash") << inc[0];
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

// --- one prefix a message ---

TEST(CommandLinePrefix, KeelLaunchSaysItsNameOnce) {
  const std::string dir = temp_dir("launch-prefix");
  const std::string cfg = write_config(dir);
  const std::string launch = bin_dir() + "/keel-launch --run-dir " + dir + "/runs ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--config " + cfg + " --local 0",
       "keel-launch: error: --local: Value 0 not in range 1 to 4096"},
      {"--config " + cfg + " --local", "keel-launch: error: --local: 1 required N missing"},
      {"--config " + cfg + " --bogus",
       "keel-launch: error: The following argument was not expected: --bogus"},
      {"--local 2", "keel-launch: error: --config FILE is required"},
      {"--config " + cfg + " --join tcp://127.0.0.1:1",
       "keel-launch: error: --join needs --slot K and --job ID"},
      {"--config " + cfg, "keel-launch: error: say where the slots are"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Bounded b = run_bounded(launch + cases[i].first, dir + "/l" + std::to_string(i), 20);
    EXPECT_EQ(b.exit_code, 2) << cases[i].first << "\n" << b.output;
    EXPECT_TRUE(contains(b.output, cases[i].second)) << b.output;
    EXPECT_EQ(count_of(b.output, "keel-launch:"), 1) << b.output;
  }
}

TEST(CommandLinePrefix, KeelCtlErrorsSayKeelCtlOnce) {
  const std::string dir = temp_dir("ctl-prefix");
  const std::string ctl = bin_dir() + "/keel-ctl ";
  const std::string secret = dir + "/secret";
  JobKey::generate().save(secret);
  const std::vector<std::tuple<std::string, int, std::string>> cases = {
      {"", 2, "keel-ctl: error: a command is needed"},
      {"bogus", 2, "keel-ctl: error: The following argument was not expected: bogus"},
      {"status --bogus", 2, "keel-ctl: error: The following argument was not expected: --bogus"},
      {"inject", 2, "keel-ctl: error: inject needs a fault"},
      {"update", 2, "keel-ctl: error: --plugin is required"},
      {"update --plugin " + secret + " --at-step 0", 2,
       "keel-ctl: error: --at-step: '0': not a step count"},
      {"update --plugin x", 2, "keel-ctl: error: --plugin x: no such file"},
      {"status --run " + dir + "/none", 2,
       "keel-ctl: error: " + dir + "/none/controller: missing or empty"},
      {"plan-standby --machines 0 --mtbf-hours 1 --recovery-minutes 1", 2,
       "keel-ctl: error: plan-standby: --machines 0"},
      {"plan-standby --machines x", 2, "keel-ctl: error: --machines x: must be a finite number"},
      // A malformed endpoint is bad input, not a controller that did not answer.
      {"status --controller bogus", 2,
       "keel-ctl: error: --controller: control-plane endpoint 'bogus': expected tcp://HOST:PORT"},
      {"status --controller tcp://127.0.0.1", 2,
       "keel-ctl: error: --controller: bad address '127.0.0.1': no port"},
      // No secret to talk with: refused before it tries.
      {"status --controller tcp://127.0.0.1:1", 2,
       "keel-ctl: error: --controller needs the job's secret: --secret-file FILE"},
      // Nothing listens on port 1: the request times out.
      {"status --controller tcp://127.0.0.1:1 --secret-file " + secret, 1,
       "keel-ctl: error: the controller did not answer within 3 s"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [args, code, want] = cases[i];
    const Bounded b = run_bounded(ctl + args, dir + "/c" + std::to_string(i), 20);
    EXPECT_EQ(b.exit_code, code) << args << "\n" << b.output;
    EXPECT_TRUE(contains(b.output, want)) << args << "\n" << b.output;
    EXPECT_EQ(count_of(b.output, "keel-ctl:"), 1) << args << "\n" << b.output;
  }
}

}  // namespace
}  // namespace keel::test
