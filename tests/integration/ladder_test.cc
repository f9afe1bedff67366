// The escalation ladder (DESIGN.md, Failure handling), each rung reached by the fault schedule
// designed for it, with real processes: a TP2×PP2×DP2 job under keel-launch (4 slots of 2
// workers, 2 standby slots). A link_error breaks one rank's connections without killing
// anything, so every rank reports a communication error and none is named:
//   rung 2, evict      the machine's network stays broken: the stop-time diagnostics fail its
//                      slot, a standby takes its ranks;
//   rung 2, reattempt  a transient break: the diagnostics pass, every rank rebuilds in place;
//   rung 3, rollback   a second break within recovery.repeat_window_steps: the job goes back
//                      to its newest persistent checkpoint;
//   rung 4, replay     a third: a dual-phase replay looks for the machine (none: reattempt).
// Each run must end bitwise equal to the fault-free run, from the restore point asserted.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

constexpr int kSteps = 80;

std::string job_args(const std::string& dir, const std::string& extra) {
  std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}});
  return "--config " + cfg +
         " --local 6 --workers-per-slot 2 --standby 2 --set train.eval_every=0"
         " --set train.steps=" +
         std::to_string(kSteps) + " --set checkpoint.persistent_every_steps=20" +
         " --set checkpoint.dir=" + dir + "/ckpt --set recovery.diagnostics_timeout_ms=20000 " +
         extra;
}

const JobRun& fault_free() {
  static const JobRun r = [] {
    std::string dir = temp_dir("ladder-clean");
    return run_launch_job(dir, job_args(dir, ""));
  }();
  return r;
}

std::vector<std::string> incidents(const JobRun& r) {
  return json_object_array(r.report, "incidents");
}

void expect_bitwise_and_clean(const JobRun& r) {
  ASSERT_EQ(fault_free().exit_code, 0) << fault_free().output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), kSteps);
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(fault_free().report, "param_checksum"))
      << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

TEST(Ladder, Rung2DiagnosticsEvictTheMachineWithBrokenLinks) {
  const std::string dir = temp_dir("ladder-2-evict");
  JobRun r = run_launch_job(dir, job_args(dir, "--fault link_error@step=30,rank=5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_bitwise_and_clean(r);
  const auto inc = incidents(r);
  ASSERT_EQ(inc.size(), 1u) << r.report;
  const std::string& i = inc[0];
  EXPECT_EQ(json_number_field(i, "ladder_rung"), 2) << i;
  EXPECT_EQ(json_string_field(i, "rung"), "evict") << i;
  EXPECT_EQ(json_array_field(i, "slots_evicted"), std::vector<double>({2})) << i;
  EXPECT_NE(json_string_field(i, "diagnostics_summary").find("slot 2 fails"), std::string::npos)
      << i;
  EXPECT_GE(json_object_array(i, "diagnostics").size(), 8u) << i;
  EXPECT_GT(json_number_field(i, "diagnosed_at"), 0) << i;
  // Back at the step of the break, from memory: nothing restarted from step 0. The evicted
  // slot's ranks load their backups on the standby; the others keep their own state.
  expect_restored(i, {.step = 30,
                      .from = "memory",
                      .world = 8,
                      .ranks = {{4, "backup"}, {5, "backup"}},
                      .others = "memory|own_snapshot"});
}

TEST(Ladder, Rung2PassedDiagnosticsReattemptInPlace) {
  const std::string dir = temp_dir("ladder-2-reattempt");
  JobRun r = run_launch_job(dir, job_args(dir, "--fault link_error@step=30,rank=5,once"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_bitwise_and_clean(r);
  const auto inc = incidents(r);
  ASSERT_EQ(inc.size(), 1u) << r.report;
  const std::string& i = inc[0];
  EXPECT_EQ(json_number_field(i, "ladder_rung"), 2) << i;
  EXPECT_EQ(json_string_field(i, "rung"), "reattempt") << i;
  EXPECT_NE(json_string_field(i, "why").find("diagnostics passed"), std::string::npos) << i;
  EXPECT_TRUE(json_array_field(i, "slots_evicted").empty()) << i;
  expect_restored(i, {.step = 30, .from = "memory", .world = 8, .others = "memory"});
}

TEST(Ladder, Rung3TheSameFailureAgainRollsBackToTheCheckpoint) {
  const std::string dir = temp_dir("ladder-3");
  JobRun r = run_launch_job(dir, job_args(dir,
                                          "--fault link_error@step=50,rank=5,once "
                                          "--fault link_error@step=55,rank=2,once"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_bitwise_and_clean(r);
  const auto inc = incidents(r);
  ASSERT_EQ(inc.size(), 2u) << r.report;
  EXPECT_EQ(json_number_field(inc[0], "ladder_rung"), 2) << inc[0];
  // The first break: diagnostics pass, every rank goes on in place from the step of the break.
  expect_restored(inc[0], {.step = 50, .from = "memory", .world = 8, .others = "memory"});
  const std::string& i = inc[1];
  EXPECT_EQ(json_number_field(i, "ladder_rung"), 3) << i;
  EXPECT_EQ(json_string_field(i, "rung"), "rollback") << i;
  EXPECT_NE(json_string_field(i, "why").find("repeat_window_steps"), std::string::npos) << i;
  // The newest persistent checkpoint, although memory held step 55.
  expect_restored(i, {.step = 40, .from = "persistent", .world = 8, .others = "persistent"});
}

TEST(Ladder, Rung4AThirdTimeReplaysToFindTheMachine) {
  const std::string dir = temp_dir("ladder-4");
  JobRun r = run_launch_job(dir, job_args(dir,
                                          "--fault link_error@step=50,rank=5,once "
                                          "--fault link_error@step=55,rank=2,once "
                                          "--fault link_error@step=58,rank=6,once"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_bitwise_and_clean(r);
  const auto inc = incidents(r);
  ASSERT_EQ(inc.size(), 3u) << r.report;
  // The first break reattempts in place at step 50; the second, within the repeat window,
  // rolls back to the newest persistent checkpoint (step 40), as in the rung 3 test.
  expect_restored(inc[0], {.step = 50, .from = "memory", .world = 8, .others = "memory"});
  expect_restored(inc[1], {.step = 40, .from = "persistent", .world = 8, .others = "persistent"});
  const std::string& i = inc[2];
  EXPECT_EQ(json_number_field(i, "ladder_rung"), 4) << i;
  EXPECT_NE(json_string_field(i, "why").find("replay"), std::string::npos) << i;
  // The breaks were transient: the replay finds no machine, and the job goes on in place.
  EXPECT_NE(json_string_field(i, "detail").find("replay of step"), std::string::npos) << i;
  EXPECT_EQ(json_string_field(i, "rung"), "reattempt") << i;
  expect_restored(i, {.step = 58, .from = "memory", .world = 8, .others = "memory|own_snapshot"});
}

}  // namespace
}  // namespace keel::test
