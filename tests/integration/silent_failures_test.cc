// The failures that do not announce themselves (issue: silent failures), with real processes
// under keel-launch: a worker frozen from outside (SIGSTOP of a PID the test found) or by a
// fault, stuck inside a collective, spinning in compute; a rank lost together with the
// holder of its backup; a slot lost under restart_all. Each test asserts where the state
// came from (the restore step and each rank's source), not only that the job ended bitwise
// equal: a silent restart from step 0 would also end equal.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

std::string config(const std::string& dir) {
  return write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}});
}

// The fault-free run of `steps` steps (TP2×PP2×DP2), once per step count.
const JobRun& fault_free(int steps) {
  static std::map<int, JobRun> runs;
  auto it = runs.find(steps);
  if (it == runs.end()) {
    std::string dir = temp_dir("silent-base-" + std::to_string(steps));
    it = runs.emplace(steps,
                      run_job(dir, "--config " + config(dir) +
                                       " --nproc 8 --set train.steps=" + std::to_string(steps)))
             .first;
  }
  return it->second;
}

std::string launch_args(const std::string& dir, int standby, int steps, const std::string& extra) {
  return "--config " + config(dir) + " --local " + std::to_string(4 + standby) +
         " --workers-per-slot 2 --standby " + std::to_string(standby) +
         " --set train.steps=" + std::to_string(steps) +
         " --set detect.slot_timeout_ms=1000 --set parallel.comm_timeout_ms=60000 " + extra;
}

void expect_equal_and_clean(const JobRun& r, int steps) {
  ASSERT_EQ(fault_free(steps).exit_code, 0) << fault_free(steps).output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(fault_free(steps).report, "param_checksum"))
      << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), steps);
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// The environment variable `key` of process `pid` ("" if absent or unreadable).
std::string env_of(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string entry;
  while (std::getline(in, entry, '\0'))
    if (entry.rfind(key + "=", 0) == 0) return entry.substr(key.size() + 1);
  return "";
}

// A rank and the holder of its backup lost at the same step: no copy of rank 7's state is
// left in memory (its own snapshot was on slot 3; its backup is the own snapshot of its DP
// replica, rank 5, on slot 2), so the job restores the newest persistent checkpoint, says
// so, and ends bitwise equal.
TEST(SilentFailures, RankAndItsHolderLostTogetherRestoreThePersistentCheckpoint) {
  constexpr int kSteps = 16;
  std::string dir = temp_dir("silent-holder");
  // Rank 7 = (t1, d1, p1) on slot 3; without ZeRO-1 its holder is its replica (d+1, p, t) =
  // rank 5, on slot 2.
  JobRun r = run_launch_job(
      dir,
      launch_args(dir, 2, kSteps,
                  "--set checkpoint.persistent_every_steps=4 --set checkpoint.dir=" + dir +
                      "/ck --fault slot_loss@step=10,rank=7 --fault slot_loss@step=10,rank=5"));
  expect_equal_and_clean(r, kSteps);
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_GE(inc.size(), 1u) << r.report;
  const std::string& i = inc.back();
  // Every rank loaded the checkpoint of step 8, as it said itself.
  expect_restored(i, {.step = 8, .from = "persistent", .world = 8, .others = "persistent"});
  EXPECT_TRUE(contains(json_string_field(i, "why_not_memory"), "rank")) << i;
  EXPECT_TRUE(contains(r.output, "restored from persistent")) << r.output;
}

TEST(SilentFailures, LostTogetherWithoutACheckpointStopsNamingTheRank) {
  std::string dir = temp_dir("silent-holder-none");
  JobRun r = run_launch_job(
      dir,
      launch_args(dir, 2, 16, "--fault slot_loss@step=10,rank=7 --fault slot_loss@step=10,rank=5"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "no copy of the state of")) << r.output;
  EXPECT_TRUE(contains(r.output, " survives")) << r.output;  // not "rank 7survives"
  EXPECT_TRUE(contains(r.output, "allow_restart_from_scratch")) << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// restart_all, the baseline: a lost slot's ranks start on the standby, every rank from the
// newest persistent checkpoint.
TEST(SilentFailures, RestartAllSurvivesASlotLossOnAStandby) {
  constexpr int kSteps = 16;
  std::string dir = temp_dir("silent-restart-all");
  JobRun r = run_launch_job(
      dir, launch_args(dir, 1, kSteps,
                       "--set recovery.mode=restart_all --set checkpoint.persistent_every_steps=4 "
                       "--set checkpoint.dir=" +
                           dir + "/ck --fault slot_loss@step=10,rank=3"));
  expect_equal_and_clean(r, kSteps);
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_TRUE(contains(json_string_field(inc[0], "action"), "restart all ranks")) << inc[0];
  EXPECT_TRUE(contains(json_string_field(inc[0], "action"), "standby slot 4")) << inc[0];
  expect_restored(inc[0], {.step = 8, .from = "persistent", .world = 8, .others = "persistent"});
}

// A hung worker is found by the right rule (the communicator timeout stays at 60 s, and a
// timeout would say so by its rule), evicted with its slot, its ranks restored from their
// backups on the standby, and the job ends bitwise equal with every step done. `step`: the
// step every rank restored, or -1 when the hang began at no step known in advance.
void expect_hang_found(const JobRun& r, int steps, int rank, const std::string& rule, double since,
                       int step) {
  expect_equal_and_clean(r, steps);
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "kind"), "hang") << inc[0];
  EXPECT_EQ(json_number_field(inc[0], "rank"), rank) << inc[0];
  EXPECT_EQ(json_string_field(inc[0], "rule"), rule) << inc[0];
  EXPECT_EQ(json_string_field(inc[0], "rung"), "evict") << inc[0];
  const int mate = rank % 2 == 0 ? rank + 1 : rank - 1;  // the other worker of its slot
  if (step >= 0) {
    // The fault struck as its rank began `step`, which no rank could complete without it: the
    // survivors hold that step live, the moved ranks load it from their backup holders.
    expect_restored(inc[0], {.step = step,
                             .from = "memory",
                             .world = 8,
                             .ranks = {{rank, "backup"}, {mate, "backup"}},
                             .others = "memory"});
  } else {
    // Stopped from outside at any point of a step, so the step varies: the newest step in
    // flight (the incident's step), or the one before where the abort found some ranks past
    // it and others still in it (those past it load the step before from their own
    // snapshots), or the one after where the stop came after the step's update and a peer
    // failed in that step's snapshot push to it (it names the step it was finishing, but
    // holds it completed). Never an older one.
    const int in_flight = int(json_number_field(inc[0], "step"));
    expect_restored(inc[0], {.min_step = in_flight - 1,
                             .max_step = in_flight + 1,
                             .from = "memory",
                             .world = 8,
                             .ranks = {{rank, "backup"}, {mate, "backup"}},
                             .others = "memory|own_snapshot"});
  }
  if (since <= 0) since = json_number_field(inc[0], "injected_at");
  EXPECT_GT(json_number_field(inc[0], "first_step_at"), since) << inc[0];
}

constexpr int kHangSteps = 60;

TEST(SilentFailures, FrozenWorkerIsFoundByItsSilence) {
  std::string dir = temp_dir("silent-freeze");
  JobRun r = run_launch_job(dir, launch_args(dir, 1, kHangSteps, "--fault freeze@step=20,rank=4"));
  expect_hang_found(r, kHangSteps, 4, "liveness", 0, 20);
}

TEST(SilentFailures, SpinningWorkerIsFoundOutsideTheCollectiveItsPeersWaitIn) {
  std::string dir = temp_dir("silent-spin");
  JobRun r = run_launch_job(dir, launch_args(dir, 1, kHangSteps, "--fault spin@step=20,rank=4"));
  expect_hang_found(r, kHangSteps, 4, "not_in_collective", 0, 20);
}

TEST(SilentFailures, WorkerStuckInsideACollectiveIsFoundBySequenceNumbers) {
  std::string dir = temp_dir("silent-in-coll");
  JobRun r = run_launch_job(
      dir, launch_args(dir, 1, kHangSteps, "--fault hang_in_collective@step=20,rank=4"));
  expect_hang_found(r, kHangSteps, 4, "collective_sequence", 0, 20);
}

// SIGSTOP from outside, to the PID of rank 4's worker found in the job's process tree.
TEST(SilentFailures, WorkerStoppedFromOutsideIsFoundByItsSilence) {
  constexpr int kSteps = 500;
  std::string dir = temp_dir("silent-sigstop");
  pid_t victim = 0;
  double stopped_at = 0;
  JobRun r = run_launch_job(
      dir, launch_args(dir, 1, kSteps, ""),
      [&](pid_t session) {
        if (stopped_at > 0) return;
        if (!victim) {
          for (pid_t p : session_processes(session))
            if (env_of(p, "KEEL_RANK") == "4" && env_of(p, "KEEL_STANDBY").empty()) victim = p;
          return;
        }
        // Let it train a while, then freeze it: a worker stopped while the job still starts
        // up (slow on a loaded machine) is a failed start, not the hang this is about.
        if (launched_job_step(launched_job_dir(dir)) < 20) return;
        ASSERT_EQ(::kill(victim, SIGSTOP), 0);
        stopped_at =
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count();
      },
      300);
  ASSERT_GT(stopped_at, 0) << "the job ended before rank 4's worker (pid " << victim
                           << ") was stopped: " << r.output;
  kill(victim, SIGCONT);  // already killed by its agent; harmless if so
  expect_hang_found(r, kSteps, 4, "liveness", stopped_at, -1);
}

// keel-ctl stacks on a running job: every worker's stacks land in runs/<job>/stacks/<name>/,
// and a healthy job has no culprit.
TEST(SilentFailures, KeelCtlStacksCapturesEveryWorker) {
  constexpr int kSteps = 400;
  std::string dir = temp_dir("silent-ctl-stacks");
  std::string out, job_dir;
  int rc = -1;
  JobRun r = run_launch_job(
      dir, launch_args(dir, 0, kSteps, ""),
      [&](pid_t) {
        if (rc >= 0) return;
        // Every worker training (not still loading its libraries on a loaded machine), so
        // that each stack shows the step loop.
        if (job_dir.empty()) job_dir = launched_job_dir(dir);
        if (launched_job_step(job_dir) < 20) return;
        const std::string cmd = bin_dir() + "/keel-ctl stacks --run " + job_dir + " --name t1 > " +
                                dir + "/ctl.out 2>&1";
        rc = std::system(cmd.c_str());
        std::ifstream in(dir + "/ctl.out");
        std::stringstream ss;
        ss << in.rdbuf();
        out = ss.str();
      },
      300);
  expect_equal_and_clean(r, kSteps);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(contains(out, job_dir + "/stacks/t1")) << out;
  for (int k = 0; k < 8; ++k) {
    std::ifstream f(job_dir + "/stacks/t1/rank" + std::to_string(k) + ".txt");
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_TRUE(contains(ss.str(), "main")) << "rank " << k << ": " << ss.str();
  }
  EXPECT_TRUE(std::filesystem::exists(job_dir + "/stacks/t1/summary.txt"));
}

// A survivor inside a long step when the abort comes is not killed as hung: the abort
// deadline scales with the step (recovery.abort_timeout_steps × the median step time).
TEST(SilentFailures, SlowStepsDoNotMakeHealthyRanksLookHung) {
  constexpr int kSteps = 12;
  std::string dir = temp_dir("silent-slow");
  // Every step of rank 6 takes 1.5 s more from step 2 on; abort_timeout_ms = 500 alone
  // would kill the survivors that wait for it when rank 2 crashes. The hang rules are kept
  // out of it: the first slow step stalls the job 1.5 s against a median of fast steps,
  // which the default hang grace (1.5 s) only just covers on a loaded machine.
  JobRun r = run_launch_job(
      dir,
      launch_args(dir, 0, kSteps,
                  "--set recovery.abort_timeout_ms=500 --fault slow@step=2,rank=6,delay_ms=1500 "
                  "--fault crash@step=6,rank=2 --set detect.slow_round_steps=0 "
                  "--set detect.hang_grace_ms=10000"));
  expect_equal_and_clean(r, kSteps);
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "action"), "restart rank 2 in place") << inc[0];
  // Rank 2 crashed as it began step 6, which no rank could complete without it: it loads
  // step 6 from its own snapshot, every other rank (rank 6 in its long step too) holds it live.
  expect_restored(inc[0], {.step = 6,
                           .from = "memory",
                           .world = 8,
                           .ranks = {{2, "own_snapshot"}},
                           .others = "memory"});
  EXPECT_FALSE(contains(r.output, "did not answer the abort")) << r.output;
  std::vector<std::string> ranks = json_object_array(r.report, "ranks");
  ASSERT_EQ(ranks.size(), 8u);
  for (int k = 0; k < 8; ++k)
    EXPECT_EQ(json_array_field(ranks[size_t(k)], "pids").size(), k == 2 ? 2u : 1u)
        << "rank " << k << ": " << ranks[size_t(k)];
}

}  // namespace
}  // namespace keel::test
