// Fail-slow, with real processes (issue: fail-slow): a TP2×PP2×DP2 job under keel-launch (4
// slots of 2 workers, 2 standby slots) in which one rank turns slow (its machine: a slow
// fault sleeps before each of its steps) or one rank's link turns slow (slow_link: each
// message it sends waits). The controller must name the right rank from the ranks' own
// figures within a few rounds, swap its slot for a standby (not restart anything from step
// 0: the restore point and the ranks' sources are asserted), and end bitwise equal to the
// fault-free run; without a standby it only warns; a long fault-free run flags nobody.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

constexpr int kSteps = 200;
constexpr int kFaultStep = 60;
constexpr int kRound = 10;  // detect.slow_round_steps

std::string job_args(const std::string& dir, const std::string& extra, int steps = kSteps,
                     int standbys = 2, TestModel model = TestModel::kGpt) {
  std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}}, model);
  return "--config " + cfg + " --local " + std::to_string(4 + standbys) +
         " --workers-per-slot 2 --standby " + std::to_string(standbys) +
         " --set train.eval_every=0 --set train.steps=" + std::to_string(steps) +
         " --set detect.slow_round_steps=" + std::to_string(kRound) + " " + extra;
}

JobRun run_fault_free(TestModel model) {
  std::string dir = temp_dir("slow-clean-" + test_model_name(model));
  return run_launch_job(dir, job_args(dir, "", kSteps, 2, model));
}

// Run once per model, and only by the tests that need it.
const JobRun& fault_free(TestModel model = TestModel::kGpt) {
  if (model == TestModel::kLlama) {
    static const JobRun llama = run_fault_free(TestModel::kLlama);
    return llama;
  }
  static const JobRun gpt = run_fault_free(TestModel::kGpt);
  return gpt;
}

// A healthy step of this job, in ms.
int step_ms(TestModel model = TestModel::kGpt) {
  const double wall = json_number_field(fault_free(model).report, "wall_s");
  return std::max(5, int(1000 * wall / kSteps));
}

std::vector<std::string> incidents_of(const JobRun& r, const std::string& kind) {
  std::vector<std::string> out;
  for (const auto& i : json_object_array(r.report, "incidents"))
    if (json_string_field(i, "kind") == kind) out.push_back(i);
  return out;
}

// The degrader named, its slot swapped for a standby, the job back at the step it was at (from
// memory: the moved ranks from their backups, the others from their live state), bitwise
// equal to the fault-free run.
void expect_swapped(const JobRun& r, const std::string& kind, int rank,
                    TestModel model = TestModel::kGpt) {
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(fault_free(model).report, "param_checksum"))
      << r.output;
  const std::vector<std::string> inc = incidents_of(r, kind);
  ASSERT_EQ(inc.size(), 1u) << r.report;
  const std::string& i = inc[0];
  EXPECT_EQ(json_number_field(i, "rank"), rank) << i;
  EXPECT_EQ(json_string_field(i, "rule"), "fail_slow") << i;
  EXPECT_EQ(json_string_field(i, "rung"), "evict") << i;
  EXPECT_EQ(json_number_field(i, "ladder_rung"), 1) << i;
  EXPECT_GT(json_number_field(i, "slow_factor"), 1.5) << i;
  EXPECT_NE(json_string_field(i, "slow_figures").find("compute ms/step"), std::string::npos) << i;
  EXPECT_GT(json_number_field(i, "injected_at"), 0) << i;
  const double found = json_number_field(i, "step");
  EXPECT_GE(found, kFaultStep) << i;
  EXPECT_LE(found, kFaultStep + 60) << i;
  EXPECT_EQ(json_array_field(i, "slots_evicted"), std::vector<double>({double(rank / 2)})) << i;
  EXPECT_EQ(json_array_field(i, "standbys_promoted").size(), 1u) << i;
  // Nothing was thrown away: the step in flight at most. The step varies with when a round's
  // figures named the degrader: the newest step in flight (the incident's step), or the one
  // before where the abort found some ranks past it and others still in it (those past it
  // load the step before from their own snapshots).
  const int mate = rank % 2 == 0 ? rank + 1 : rank - 1;
  expect_restored(i, {.min_step = int(found) - 1,
                      .max_step = int(found),
                      .from = "memory",
                      .world = 8,
                      .ranks = {{rank, "backup"}, {mate, "backup"}},
                      .others = "memory|own_snapshot"});
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// For every model: the rank's figures, the standby's self-check and the swap do not depend on
// the plugin the job trains.
class FailSlowModels : public testing::TestWithParam<TestModel> {};

TEST_P(FailSlowModels, AFourTimesSlowerRankIsSwappedForAStandby) {
  const TestModel model = GetParam();
  const JobRun& base = fault_free(model);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  EXPECT_TRUE(json_object_array(base.report, "incidents").empty()) << base.report;
  const std::string dir = temp_dir("slow-rank");
  const std::string fault = "slow@step=" + std::to_string(kFaultStep) +
                            ",rank=5,delay_ms=" + std::to_string(3 * step_ms(model));
  JobRun r = run_launch_job(dir, job_args(dir, "--fault " + fault, kSteps, 2, model));
  expect_swapped(r, "slow", 5, model);
  // Every rank's figures reach the report.
  EXPECT_EQ(json_object_array(r.report, "rank_perf").size(), 8u) << r.report;
}

INSTANTIATE_TEST_SUITE_P(Models, FailSlowModels,
                         testing::Values(TestModel::kGpt, TestModel::kLlama),
                         [](const auto& p) { return test_model_name(p.param); });

TEST(FailSlow, ASlowLinkIsPinnedOnItsRank) {
  ASSERT_EQ(fault_free().exit_code, 0) << fault_free().output;
  const std::string dir = temp_dir("slow-link");
  JobRun r = run_launch_job(
      dir,
      job_args(dir, "--fault slow_link@step=" + std::to_string(kFaultStep) + ",rank=3,delay_ms=2"));
  expect_swapped(r, "slow_link", 3);
}

// The machine swapped out for being slow is healthy enough to check itself: it comes back as
// a standby and takes the ranks of the next machine evicted (the slowness stayed with the
// process that had it).
TEST(FailSlow, TheSwappedOutMachineServesAsTheNextStandby) {
  ASSERT_EQ(fault_free().exit_code, 0) << fault_free().output;
  const std::string dir = temp_dir("slow-reuse");
  JobRun r = run_launch_job(
      dir, job_args(dir,
                    "--fault slow@step=40,rank=5,delay_ms=" + std::to_string(3 * step_ms()) +
                        " --fault hang@step=150,rank=6 --set parallel.comm_timeout_ms=60000",
                    kSteps, /*standbys=*/1));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(fault_free().report, "param_checksum"))
      << r.output;
  const auto inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 2u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "kind"), "slow") << inc[0];
  EXPECT_EQ(json_array_field(inc[0], "slots_evicted"), std::vector<double>({2})) << inc[0];
  EXPECT_EQ(json_array_field(inc[0], "standbys_promoted"), std::vector<double>({4})) << inc[0];
  EXPECT_EQ(json_string_field(inc[1], "kind"), "hang") << inc[1];
  EXPECT_EQ(json_array_field(inc[1], "slots_evicted"), std::vector<double>({3})) << inc[1];
  EXPECT_EQ(json_array_field(inc[1], "standbys_promoted"), std::vector<double>({2})) << inc[1];
  // Each time the evicted slot's ranks load their backups on the standby, from memory, and
  // no more than the step in flight is lost. The slow rank is swapped out whenever a round's
  // figures name it: the step in flight then, or the one before (as in expect_swapped).
  const int slow_found = int(json_number_field(inc[0], "step"));
  expect_restored(inc[0], {.min_step = slow_found - 1,
                           .max_step = slow_found,
                           .from = "memory",
                           .world = 8,
                           .ranks = {{4, "backup"}, {5, "backup"}},
                           .others = "memory|own_snapshot"});
  // The hang strikes as rank 6 begins step 150, which no rank can complete without it: step
  // 150 exactly, live in every survivor's memory.
  expect_restored(inc[1], {.step = 150,
                           .from = "memory",
                           .world = 8,
                           .ranks = {{6, "backup"}, {7, "backup"}},
                           .others = "memory"});
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

// Without a standby to take its ranks the degrader is named, once, and the job goes on slowly.
TEST(FailSlow, WithoutAStandbyItWarnsAndTrainsOn) {
  ASSERT_EQ(fault_free().exit_code, 0) << fault_free().output;
  const std::string dir = temp_dir("slow-warn");
  const int steps = 120;
  JobRun r = run_launch_job(dir, job_args(dir,
                                          "--fault slow@step=" + std::to_string(kFaultStep) +
                                              ",rank=5,delay_ms=" + std::to_string(3 * step_ms()),
                                          steps, /*standbys=*/0));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> inc = incidents_of(r, "slow");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_number_field(inc[0], "rank"), 5) << inc[0];
  EXPECT_EQ(json_string_field(inc[0], "rung"), "warn") << inc[0];
  EXPECT_NE(json_string_field(inc[0], "why").find("no standby"), std::string::npos) << inc[0];
  EXPECT_TRUE(json_array_field(inc[0], "slots_evicted").empty()) << inc[0];
  // Nothing was recovered: no epoch change, every step ran once.
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), steps);
  EXPECT_EQ(r.output.find("incident 1:"), std::string::npos) << r.output;
}

// False positives are what make operators switch a detector off: 1,000 steps of a healthy
// job on this oversubscribed machine (8 ranks on 2 cores) must flag nobody. (A whole-job
// mfu_decline names no rank and is not a false positive when another process took the
// cores meanwhile; it is printed, not failed.)
TEST(FailSlow, AThousandHealthyStepsFlagNobody) {
  const std::string dir = temp_dir("slow-none");
  JobRun r = run_launch_job(dir, job_args(dir, "", 1000), {}, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& i : json_object_array(r.report, "incidents")) {
    if (json_string_field(i, "kind") == "mfu_decline") {
      std::printf("note: %s\n", json_string_field(i, "detail").c_str());
      continue;
    }
    ADD_FAILURE() << "a healthy run flagged: " << json_string_field(i, "kind") << " rank "
                  << json_number_field(i, "rank") << ": " << json_string_field(i, "detail") << " ("
                  << json_string_field(i, "slow_figures") << ")";
  }
}

}  // namespace
}  // namespace keel::test
