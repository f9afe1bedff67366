// recovery.on_no_standby = reshape (issue 30, part 2), with real processes: a job on 2 slots
// of 2 workers and no standby loses slot 1; it cannot shrink data parallelism (DP 1, or
// ZeRO-1), so the survivors take the largest layout slot 0 holds and read their new state
// from the old ranks' copies in memory (their own snapshots, the lost ranks' backups on
// slot 0), and every step is done; when slot 1 joins again the job grows back the same way.
// Asserted: the layouts, the restore point and its source per rank (not step 0, not a
// checkpoint: the job writes none), each rank's own account of what it read, and every loss
// within the layout tests' fp32 tolerance of the same job never reshaped.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

struct Case {
  std::string name, parallel;
  std::string action;  // the incident's
  TestModel model = TestModel::kGpt;
  bool grow_back = false;  // slot 1 joins again and the job grows back to its layout
};

// The line rank `rank` logs once it has read step `step` into `layout`.
std::string read_line(int rank, int64_t step, const std::string& layout) {
  return "rank " + std::to_string(rank) + ": step " + std::to_string(step) + " read into " +
         layout + " from the old ranks' copies in memory";
}

// Every loss within the layout tests' fp32 tolerance of the never-reshaped run's `want`, and
// nothing of the job left behind.
void expect_close_and_clean(const JobRun& r, const std::vector<double>& want) {
  std::vector<double> got = json_array_field(r.report, "losses");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::abs(got[i] - want[i]) / std::abs(want[i]), 1e-4) << "step " << i;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.leftover_shm.front();
  EXPECT_EQ(r.leftover_processes, 0);
}

void reshape_after_losing_slot_one(const Case& c) {
  // Growing back needs time for slot 1's launcher to start and its standby to check itself:
  // rank 0 paces the job after the loss (only that; the numbers are the same).
  const int steps = c.grow_back ? 120 : 40;
  const std::string dir = temp_dir(c.name);
  const std::string cfg = write_config(dir, {{"parallel", c.parallel}}, c.model);
  const std::string common =
      "--config " + cfg + " --set train.eval_every=0 --set train.steps=" + std::to_string(steps);
  const JobRun base = run_job(dir, common + " --nproc 4");
  ASSERT_EQ(base.exit_code, 0) << base.output;
  const std::vector<double> want = json_array_field(base.report, "losses");

  pid_t joiner = -1;
  const JobRun r = run_launch_job(
      dir,
      common + " --local 2 --workers-per-slot 2 --set recovery.on_no_standby=reshape" +
          " --fault slot_loss@step=20,rank=3" +
          (c.grow_back ? " --fault slow@step=20,rank=0,delay_ms=30 --set detect.slow_round_steps=0"
                       : ""),
      [&](pid_t) {
        if (!c.grow_back || joiner > 0) return;
        if (!contains(read_text(dir + "/job.log"), "reshape from")) return;
        joiner = join_slot(dir, 1, common + " --workers-per-slot 2");
      });
  int join_status = 0;
  if (joiner > 0) waitpid(joiner, &join_status, 0);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), steps);
  const std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "rung"), "reshape") << inc[0];
  EXPECT_TRUE(contains(json_string_field(inc[0], "action"), c.action)) << inc[0];
  // Rank 3's slot went as it began step 21: step 20, or 19 where its slot-mate died before
  // step 20's last collective. Both new ranks read it from the old ranks' copies in memory.
  expect_restored(
      inc[0], {.min_step = 19, .max_step = 20, .from = "memory", .world = 2, .others = "memory"});
  const int64_t S = int64_t(json_number_field(inc[0], "restored_step"));
  // Each survivor read its new state from the old ranks' copies (its rank's log says so).
  const std::string job_dir = launched_job_dir(dir);
  for (int rank : {0, 1}) {
    const std::string log = read_text(job_dir + "/logs/rank" + std::to_string(rank) + ".log");
    EXPECT_TRUE(contains(log, read_line(rank, S, "tp2 pp1 dp1"))) << log;
  }
  if (c.grow_back) {
    ASSERT_GT(joiner, 0) << r.output;
    EXPECT_TRUE(WIFEXITED(join_status) && WEXITSTATUS(join_status) == 0)
        << "the rejoined slot's launcher did not end cleanly\n"
        << read_text(dir + "/join.log");
    EXPECT_TRUE(contains(r.output, "grow back from TP2xPP1xDP1 to TP2xPP2xDP1")) << r.output;
    EXPECT_EQ(json_string_field(r.report, "layout"), "tp2 pp2 dp1");
    // Every rank of the grown layout read the same step from the survivors' copies: ranks 0
    // and 1 in the processes that trained through both changes, ranks 2 and 3 new on slot 1.
    const std::string log0 = read_text(job_dir + "/logs/rank0.log");
    const size_t at = log0.find(" read into tp2 pp2 dp1");
    ASSERT_NE(at, std::string::npos) << log0;
    const size_t from = log0.rfind(": step ", at) + 7;
    const int64_t grown = std::stoll(log0.substr(from, at - from));
    EXPECT_GT(grown, S);
    // Slot 1's workers began as its standbys: their logs are named so.
    std::string logs;
    for (const auto& f : std::filesystem::directory_iterator(job_dir + "/logs"))
      logs += read_text(f.path().string());
    for (int rank : {1, 2, 3})
      EXPECT_TRUE(contains(logs, read_line(rank, grown, "tp2 pp2 dp1"))) << "rank " << rank;
    const std::vector<std::string> ranks = json_object_array(r.report, "ranks");
    ASSERT_EQ(ranks.size(), 4u);
    for (int k : {0, 1})
      EXPECT_EQ(json_array_field(ranks[size_t(k)], "pids").size(), 1u) << ranks[size_t(k)];
  } else {
    EXPECT_EQ(json_string_field(r.report, "layout"), "tp2 pp1 dp1");
  }
  expect_close_and_clean(r, want);
}

TEST(Reshape, ASlotLostAtDpOneTheSurvivorsGoOnAtTpTwoAndGrowBack) {
  reshape_after_losing_slot_one(
      {.name = "reshape-3d",
       .parallel = "tp: 2 pp: 2 dp: 1",
       .action = "reshape from TP2xPP2xDP1 to TP2xPP1xDP1 on 1 of 1 slot(s)",
       .grow_back = true});
}

// A second plugin gets it through the public plugin API alone.
TEST(Reshape, TheLlamaPluginReshapesToo) {
  reshape_after_losing_slot_one(
      {.name = "reshape-llama",
       .parallel = "tp: 2 pp: 2 dp: 1",
       .action = "reshape from TP2xPP2xDP1 to TP2xPP1xDP1 on 1 of 1 slot(s)",
       .model = TestModel::kLlama});
}

TEST(Reshape, ZeroOneShardsAreGatheredFromTheLostReplicasBackups) {
  reshape_after_losing_slot_one(
      {.name = "reshape-zero1",
       .parallel = "tp: 2 dp: 2 zero1: true",
       .action = "reshape from TP2xPP1xDP2 to TP2xPP1xDP1 on 1 of 1 slot(s)"});
}

// Four slots of one worker at DP4 with ZeRO-1 and a global batch of 8 (micro-batches of 2):
// after slot 3 is lost, three slots could hold DP3, which does not split the batch, so the job
// takes DP2 on slots 0 and 1 and slot 2 retires (its worker stopped, the slot a standby).
// Rank 2's moment shard was backed up by rank 3, lost with it, and rank 2's own copy goes
// with its process: memory cannot cover every old rank, so the new layout loads the newest
// persistent checkpoint (step 20), and the incident says why.
TEST(Reshape, WhatMemoryCannotCoverComesFromTheCheckpoint) {
  const std::string dir = temp_dir("reshape-ckpt");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 4 zero1: true"}});
  const std::string common = "--config " + cfg +
                             " --set train.eval_every=0 --set train.steps=40"
                             " --set checkpoint.persistent_every_steps=10 --set checkpoint.dir=";
  const JobRun base = run_job(dir, common + dir + "/ckpt-base --nproc 4");
  ASSERT_EQ(base.exit_code, 0) << base.output;
  const std::vector<double> want = json_array_field(base.report, "losses");
  const JobRun r = run_launch_job(dir, common + dir +
                                           "/ckpt --local 4 --set recovery.on_no_standby=reshape"
                                           " --fault slot_loss@step=25,rank=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 40);
  EXPECT_EQ(json_string_field(r.report, "layout"), "tp1 pp1 dp2");
  const std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "rung"), "reshape") << inc[0];
  EXPECT_TRUE(contains(json_string_field(inc[0], "action"),
                       "reshape from TP1xPP1xDP4 to TP1xPP1xDP2 on 2 of 3 slot(s)"))
      << inc[0];
  EXPECT_TRUE(contains(json_string_field(inc[0], "action"), "slot(s) 2 wait as standbys"))
      << inc[0];
  EXPECT_EQ(json_string_field(inc[0], "restored_from"), "persistent") << inc[0];
  EXPECT_EQ(json_number_field(inc[0], "restored_step"), 20) << inc[0];
  EXPECT_TRUE(contains(json_string_field(inc[0], "why_not_memory"), "rank 2")) << inc[0];
  expect_close_and_clean(r, want);
}

}  // namespace
}  // namespace keel::test
