// Standbys stay warm (issue 46), with real processes and faults from outside: a parked
// standby worker killed with kill -9 is started again (its slot checked anew) and another
// slot's hang is still taken by a standby; a standby that never finishes its check is waited
// for no longer than recovery.standby_wait_ms, then the configured fallback runs.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/job_env.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The job's processes named `comm` (keel-standby, keel-worker) on slot `slot`.
std::vector<pid_t> slot_processes(const std::string& job, int slot, const std::string& comm) {
  std::vector<pid_t> out;
  if (job.empty()) return out;
  std::string want_job = std::string(env::kJobId) + "=" + job;
  want_job.push_back('\0');
  std::string want_slot = "\n";  // environ's entries end with NUL: made to start with one too
  want_slot[0] = '\0';
  want_slot += std::string(env::kSlot) + "=" + std::to_string(slot);
  want_slot.push_back('\0');
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (read_text(e.path().string() + "/comm") != comm + "\n") continue;
    std::string vars = "\n";
    vars[0] = '\0';
    vars += read_text(e.path().string() + "/environ");
    if (contains(vars, want_job) && contains(vars, want_slot)) out.push_back(std::stoi(pid));
  }
  return out;
}

// The parent of `pid` (its slot's agent for a worker), -1 if gone.
pid_t parent_of(pid_t pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return -1;
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  char state = 0;
  pid_t parent = -1;
  rest >> state >> parent;
  return parent;
}

std::string job_of(const std::string& dir) {
  const std::string job_dir = launched_job_dir(dir);
  return job_dir.empty() ? "" : fs::path(job_dir).filename().string();
}

// The events of `kind` in a job's events.jsonl, one line each.
std::vector<std::string> events_of(const std::string& events, const std::string& kind) {
  std::vector<std::string> out;
  std::istringstream in(events);
  for (std::string line; std::getline(in, line);)
    if (contains(line, "\"kind\":\"" + kind + "\"")) out.push_back(line);
  return out;
}

const std::string kSets =
    " --set train.eval_every=0 --set train.seed=11 --set detect.slow_round_steps=0";

// TP2×PP2×DP2 on 4 slots of 2 workers and 2 standby slots (the job). A parked worker
// of standby slot 5 is killed -9 while it checks itself: slot 5 is checked again and holds two
// parked workers again; then a worker of slot 2 is stopped (SIGSTOP, a hang): a standby takes
// its ranks and the job ends bitwise equal to the fault-free run. Before, slot 4's check (one
// all-reduce among every standby) failed with the dead worker, slot 5 was never started again,
// and the recovery waited for ever on a standby that could not come.
TEST(StandbyWarm, AKilledParkedWorkerIsStartedAgainAndAHangIsStillTakenByAStandby) {
  const std::string dir = temp_dir("standby-warm");
  const std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}});
  const std::string job = "--config " + cfg +
                          " --local 6 --standby 2 --workers-per-slot 2 --set train.steps=600" +
                          kSets;
  JobRun ref = run_launch_job(temp_dir("standby-warm-ref"), job);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  pid_t killed = -1, stopped = -1;
  std::set<pid_t> back;
  std::string what;
  auto next_look = Clock::now();
  // 40 ms a step on rank 0: the job outlasts the second check (seconds) by far.
  JobRun r = run_launch_job(dir, job + " --fault slow@step=0,rank=0,delay_ms=40", [&](pid_t) {
    const std::string id = job_of(dir);
    if (killed < 0) {
      const std::vector<pid_t> parked = slot_processes(id, 5, "keel-standby");
      if (parked.empty()) return;
      killed = parked.front();
      kill(killed, SIGKILL);
      return;
    }
    if (back.size() < 2) {
      for (pid_t p : slot_processes(id, 5, "keel-standby"))
        if (p != killed) back.insert(p);
      if (back.size() < 2) return;
      what = contains(read_text(launched_job_dir(dir) + "/events.jsonl"), "standby_restart")
                 ? "restart said"
                 : "restart not said";
    }
    if (stopped < 0) {
      // A hang in training, not in the job's start: once the ranks are past step 20
      // (asked at most twice a second: keel-ctl status is a process of its own).
      if (Clock::now() < next_look) return;
      next_look = Clock::now() + std::chrono::milliseconds(500);
      if (launched_job_step(launched_job_dir(dir)) < 20) return;
      const std::vector<pid_t> w = slot_processes(id, 2, "keel-worker");
      if (w.empty()) return;
      stopped = w.front();
      kill(stopped, SIGSTOP);
    }
  });
  if (stopped > 0) kill(stopped, SIGCONT);  // if it outlived the job (it must not)
  ASSERT_GT(killed, 0) << "no parked standby worker on slot 5\n" << r.output;
  ASSERT_EQ(back.size(), 2u) << "slot 5's parked workers were not started again\n" << r.output;
  EXPECT_EQ(what, "restart said");
  ASSERT_GT(stopped, 0) << "the job ended before a worker of slot 2 could be stopped\n" << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 600);
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(ref.report, "param_checksum"));
  const std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  const std::vector<double> promoted = json_array_field(inc[0], "standbys_promoted");
  ASSERT_EQ(promoted.size(), 1u) << inc[0];
  EXPECT_TRUE(promoted[0] == 4 || promoted[0] == 5) << inc[0];
  EXPECT_EQ(json_array_field(inc[0], "slots_evicted"), std::vector<double>{2}) << inc[0];
  const std::string events = read_text(launched_job_dir(dir) + "/events.jsonl");
  EXPECT_TRUE(events_of(events, "standby_unusable").empty()) << events;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// The only standby freezes (SIGSTOP) in its self-check, and a slot is lost (its agent killed
// -9): the recovery waits for the standby no longer than recovery.standby_wait_ms, says so,
// and takes the configured fallback (on_no_standby = shrink_dp: one DP replica fewer); the job
// ends every step done. Before, a standby still checking itself was waited for 30 s whatever
// the configuration, and the end of the wait was not said.
TEST(StandbyWarm, AStandbyThatNeverFinishesItsCheckIsWaitedForNoLongerThanTheBound) {
  const std::string dir = temp_dir("standby-wait-bound");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 3"}});
  std::string id;
  pid_t frozen = -1, lost_agent = -1;
  JobRun r = run_launch_job(
      dir,
      "--config " + cfg +
          " --local 4 --standby 1 --set train.steps=300 --set train.global_batch_size=24"
          " --set recovery.on_no_standby=shrink_dp --set recovery.standby_wait_ms=10000"
          " --fault slow@step=0,rank=0,delay_ms=20" +
          kSets,
      [&](pid_t) {
        if (id.empty()) id = job_of(dir);
        if (frozen < 0) {
          const std::vector<pid_t> s = slot_processes(id, 3, "keel-standby");
          if (s.empty()) return;
          frozen = s.front();
          kill(frozen, SIGSTOP);
          return;
        }
        if (lost_agent < 0) {
          const std::vector<pid_t> w = slot_processes(id, 2, "keel-worker");
          if (w.empty()) return;
          lost_agent = parent_of(w.front());
          if (lost_agent > 0) kill(lost_agent, SIGKILL);
        }
      });
  if (frozen > 0) kill(frozen, SIGCONT);
  ASSERT_GT(frozen, 0) << r.output;
  ASSERT_GT(lost_agent, 0) << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 300);
  const std::string events = read_text(launched_job_dir(dir) + "/events.jsonl");
  const std::vector<std::string> waits = events_of(events, "wait");
  ASSERT_FALSE(waits.empty()) << events;
  EXPECT_TRUE(contains(waits.front(), "still checking itself")) << waits.front();
  EXPECT_TRUE(contains(waits.front(), "recovery.standby_wait_ms = 10000")) << waits.front();
  const std::vector<std::string> over = events_of(events, "wait_over");
  ASSERT_EQ(over.size(), 1u) << events;
  EXPECT_TRUE(contains(over[0], "waited recovery.standby_wait_ms = 10000 ms")) << over[0];
  const std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_FALSE(inc.empty()) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "rung"), "shrink") << inc[0];
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

}  // namespace
}  // namespace keel::test
