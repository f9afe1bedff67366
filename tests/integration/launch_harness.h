// What the keel-launch end-to-end tests share (launch_test.cc: --local and mpirun;
// launch_netns_test.cc: machines made of network namespaces): the job configs, running a
// launcher as its own session and collecting what it left, and the comparisons.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test::launch {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline constexpr int kSteps = 30;
inline const std::string kTp2Dp2 = "tp: 2 dp: 2";
inline const std::string kPp2Dp2 = "pp: 2 dp: 2";
// Three machines with a TP pair each: rank = 2·d + t, so slot d holds DP replica d and the
// backup holder of (d, t), (d+1, t+1), lives on the next slot.
inline const std::string kTp2Dp3 = "tp: 2 dp: 3";

inline std::string launch_bin() {
  return bin_dir() + "/keel-launch";
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The job's directory under `run_dir` (a run directory holds one job here), "" if none yet.
inline std::string job_dir_in(const std::string& run_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec))
    if (e.is_directory()) return e.path().string();
  return "";
}

// The job's shared-memory segments still in /dev/shm (names keel-<job>-r<R> / -b<R>).
inline std::vector<std::string> job_shm(const std::string& job) {
  std::vector<std::string> out;
  if (job.empty()) return out;
  const std::string prefix = "keel-" + job + "-";
  for (const auto& e : fs::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().string());
  return out;
}

struct LaunchRun {
  int exit_code = -1;
  double seconds = 0;
  std::string output;  // stdout and stderr of the launcher (slot 0's under namespaces)
  std::string job, job_dir;
  std::string report, events;
  int leftover_processes = 0;
  std::vector<std::string> leftover_shm;  // the job's segments still there (then removed)
};

// Reads the run directory of a finished job and removes (after noting) its leftover segments.
inline void collect(LaunchRun* r, const std::string& run_dir) {
  r->job_dir = job_dir_in(run_dir);
  if (r->job_dir.empty()) return;
  r->job = fs::path(r->job_dir).filename().string();
  r->report = slurp(r->job_dir + "/report.json");
  r->events = slurp(r->job_dir + "/events.jsonl");
  r->leftover_shm = job_shm(r->job);
  for (const auto& p : r->leftover_shm) fs::remove(p);
}

// Runs the shell command line `cmd` as the leader of its own session, output into
// dir/launch.log, its job's run directory dir/runs; `poll(pid)` every 20 ms. Kills the
// session after `timeout_s`. Leftover processes are counted, then killed.
inline LaunchRun run_launch(const std::string& dir, const std::string& cmd,
                            const std::function<void(pid_t)>& poll = {}, int timeout_s = 120) {
  LaunchRun r;
  const std::string log = dir + "/launch.log";
  const auto t0 = Clock::now();
  const pid_t pid = start_session({"/bin/sh", "-c", "exec " + cmd}, log);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (poll) poll(pid);
    if (seconds_since(t0) > timeout_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  r.seconds = seconds_since(t0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // PDEATHSIG may still be on its way to what outlived it: wait for the session to empty
  // (with a deadline), then count what is left.
  std::vector<pid_t> left = wait_for_empty_session(pid);
  r.leftover_processes = int(left.size());
  for (pid_t p : left) kill(p, SIGKILL);
  r.output = slurp(log);
  collect(&r, dir + "/runs");
  return r;
}

// `keel-launch --quiet --config CFG --run-dir DIR/runs --set train.steps=30 <extra>`.
inline std::string launch_cmd(const std::string& dir, const std::string& cfg,
                              const std::string& extra) {
  return launch_bin() + " --quiet --config " + cfg + " --run-dir " + dir +
         "/runs --set train.steps=" + std::to_string(kSteps) + " " + extra;
}

// write_config() with the given parallel section; three DP replicas of micro-batches of 2
// need a global batch that 6 divides.
inline std::string job_config(const std::string& dir, const std::string& parallel) {
  const std::string path = write_config(dir, {{"parallel", parallel}});
  if (parallel != kTp2Dp3) return path;
  std::string text = slurp(path);
  const std::string from = "global_batch_size: 8", to = "global_batch_size: 12";
  text.replace(text.find(from), from.size(), to);
  std::ofstream(path) << text;
  return path;
}

// The same job under `keel-worker --nproc`, once per layout.
inline const JobRun& nproc_reference(const std::string& parallel, int world) {
  static std::map<std::string, JobRun> runs;
  auto it = runs.find(parallel);
  if (it == runs.end()) {
    const std::string dir = temp_dir("nproc");
    const std::string cfg = job_config(dir, parallel);
    it = runs.emplace(parallel,
                      run_job(dir, "--config " + cfg + " --nproc " + std::to_string(world) +
                                       " --set train.steps=" + std::to_string(kSteps)))
             .first;
  }
  return it->second;
}

inline void expect_clean(const LaunchRun& r) {
  EXPECT_EQ(r.leftover_processes, 0) << "processes outlived the job\n" << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << "shared memory left behind: " << r.leftover_shm.size()
                                      << " segment(s), e.g. " << r.leftover_shm[0];
}

inline void expect_bitwise_equal(const std::string& report, const std::string& reference) {
  ASSERT_FALSE(report.empty()) << "no report";
  ASSERT_FALSE(reference.empty()) << "no reference report";
  EXPECT_EQ(json_string_field(report, "param_checksum"),
            json_string_field(reference, "param_checksum"));
  const std::vector<double> losses = json_array_field(report, "losses");
  EXPECT_EQ(losses.size(), size_t(kSteps));
  EXPECT_EQ(losses, json_array_field(reference, "losses"));
}

}  // namespace keel::test::launch
