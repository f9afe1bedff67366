// Hot updates of the model's plugin (issue: hot update), with real processes: a TP2×PP2×DP2
// job under keel-launch (4 slots of 2 workers and a standby) gets `keel-ctl update` while it
// trains. Another build of the same model is applied at a step boundary with no process
// restarted and the job ends bitwise equal to one never updated; code that crashes on
// probation is rolled back (plugin and state) and the job still ends bitwise equal; a plugin
// that does not fit the state, or the ABI, is refused and changes nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

constexpr int kSteps = 300;

std::string job_args(const std::string& dir, const std::string& extra = "",
                     TestModel model = TestModel::kGpt) {
  std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}}, model);
  return "--config " + cfg + " --local 5 --workers-per-slot 2 --standby 1" +
         " --set train.eval_every=0 --set train.steps=" + std::to_string(kSteps) +
         " --set parallel.comm_timeout_ms=60000 " + extra;
}

JobRun run_never_updated(TestModel model) {
  std::string dir = temp_dir("update-clean-" + test_model_name(model));
  return run_launch_job(dir, job_args(dir, "", model));
}

// Run once per model, and only by the tests that need it.
const JobRun& never_updated(TestModel model = TestModel::kGpt) {
  if (model == TestModel::kLlama) {
    static const JobRun llama = run_never_updated(TestModel::kLlama);
    return llama;
  }
  static const JobRun gpt = run_never_updated(TestModel::kGpt);
  return gpt;
}

struct Ctl {
  int rc = -1;
  std::string out;
};

// Runs keel-ctl with --run added; its exit status and what it printed.
Ctl run_ctl(const std::string& dir, const std::string& job_dir, const std::string& command) {
  const std::string out = dir + "/ctl.out";
  Ctl c;
  c.rc = std::system(
      (bin_dir() + "/keel-ctl " + command + " --run " + job_dir + " > " + out + " 2>&1").c_str());
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  c.out = ss.str();
  return c;
}

// Runs the job; once it has done `at` steps, runs each keel-ctl command (with --run added).
// Paces a job (rank 0 sleeps 10 ms a step: 300 steps take 3 s at least) whose commands must
// land between given steps: unpaced, this job runs 60-90 steps a second on 2 cores, and a
// command issued at step 20 may find step 150 passed. Not a degrader (numbers unchanged).
constexpr const char* kPaced =
    " --fault slow@step=0,rank=0,delay_ms=10 --set detect.slow_round_steps=0";

JobRun run_with(const std::string& dir, const std::string& extra,
                const std::vector<std::string>& commands, std::vector<Ctl>* results, int at = 20,
                TestModel model = TestModel::kGpt) {
  std::string job_dir;
  size_t next = 0;
  results->assign(commands.size(), {});
  return run_launch_job(
      dir, job_args(dir, extra, model),
      [&](pid_t) {
        if (next >= commands.size()) return;
        if (job_dir.empty()) job_dir = launched_job_dir(dir);
        if (job_dir.empty() || launched_job_step(job_dir) < at) return;
        for (; next < commands.size(); ++next)
          (*results)[next] = run_ctl(dir, job_dir, commands[next]);
      },
      300);
}

std::vector<std::string> incidents_of(const JobRun& r, const std::string& kind) {
  std::vector<std::string> out;
  for (const auto& i : json_object_array(r.report, "incidents"))
    if (json_string_field(i, "kind") == kind) out.push_back(i);
  return out;
}

void expect_bitwise_and_whole(const JobRun& r, TestModel model = TestModel::kGpt) {
  const JobRun& base = never_updated(model);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), kSteps);
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(base.report, "param_checksum"))
      << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

// For every model: another build of the job's own plugin (libkeel_<model>_proxy.so, the same
// code as a different file) is applied through the public plugin table alone.
class HotUpdateModels : public testing::TestWithParam<TestModel> {};

TEST_P(HotUpdateModels, AnotherBuildIsAppliedInPlaceWithNoProcessRestarted) {
  const TestModel model = GetParam();
  std::string dir = temp_dir("update-apply");
  std::vector<Ctl> ctl;
  JobRun r = run_with(
      dir, "",
      {"update --plugin " + bin_dir() + "/libkeel_" + test_model_name(model) + "_proxy.so"}, &ctl,
      20, model);
  ASSERT_EQ(ctl[0].rc, 0) << ctl[0].out;
  expect_bitwise_and_whole(r, model);
  const std::vector<std::string> ups = json_object_array(r.report, "updates");
  ASSERT_EQ(ups.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(ups[0], "outcome"), "applied") << ups[0];
  EXPECT_GE(std::stoll(json_string_field(ups[0], "applied_step")), 20) << ups[0];
  EXPECT_NE(json_string_field(ups[0], "hash"), json_string_field(ups[0], "previous_hash"));
  EXPECT_EQ(incidents_of(r, "update").size(), 1u) << r.report;
  for (const auto& rank : json_object_array(r.report, "ranks"))
    EXPECT_EQ(json_array_field(rank, "pids").size(), 1u) << rank;
}

INSTANTIATE_TEST_SUITE_P(Models, HotUpdateModels,
                         testing::Values(TestModel::kGpt, TestModel::kLlama),
                         [](const auto& p) { return test_model_name(p.param); });

TEST(HotUpdate, CodeThatCrashesOnProbationIsRolledBack) {
  std::string dir = temp_dir("update-crash");
  std::vector<Ctl> ctl;
  JobRun r = run_with(dir, "", {"update --plugin " + bin_dir() + "/libkeel_gpt_crashing.so"}, &ctl);
  ASSERT_EQ(ctl[0].rc, 0) << ctl[0].out;
  expect_bitwise_and_whole(r);
  const std::vector<std::string> ups = json_object_array(r.report, "updates");
  ASSERT_EQ(ups.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(ups[0], "outcome"), "rolled_back") << ups[0];
  const std::vector<std::string> rb = incidents_of(r, "rollback");
  ASSERT_EQ(rb.size(), 1u) << r.report;
  // Back to the state from before the update, not to step 0: every rank from its own memory.
  // The rollback restores at most the step the update was applied at, and the crashing build
  // fails within two steps of it (its fourth forward), so every rank still holds that step,
  // live or in one of its two snapshot slots: exactly the applied step.
  const int applied = std::stoi(json_string_field(ups[0], "applied_step"));
  EXPECT_GE(applied, 20) << ups[0];
  expect_restored(rb[0],
                  {.step = applied, .from = "memory", .world = 8, .others = "memory|own_snapshot"});
}

TEST(HotUpdate, APluginThatDoesNotFitTheStateIsRefused) {
  std::string dir = temp_dir("update-refuse");
  std::vector<Ctl> ctl;
  // The wrong ABI first: the controller refuses it at once, so the second request does not
  // meet an update still being checked (one update at a time).
  JobRun r = run_with(dir, "",
                      {"update --plugin " + bin_dir() + "/libkeel_broken_bad_abi.so",
                       "update --plugin " + bin_dir() + "/libkeel_gpt_renamed.so"},
                      &ctl);
  expect_bitwise_and_whole(r);
  EXPECT_EQ(ctl[0].rc >> 8, 2) << ctl[0].out;
  EXPECT_NE(ctl[0].out.find("abi_version"), std::string::npos) << ctl[0].out;
  EXPECT_EQ(ctl[1].rc, 0) << ctl[1].out;  // taken, to be checked by every rank
  const std::vector<std::string> ups = json_object_array(r.report, "updates");
  ASSERT_EQ(ups.size(), 2u) << r.report;
  EXPECT_EQ(json_string_field(ups[0], "outcome"), "refused") << ups[0];
  // Another table: every rank checks it against its state, and the first difference is named.
  EXPECT_EQ(json_string_field(ups[1], "outcome"), "refused") << ups[1];
  EXPECT_NE(json_string_field(ups[1], "why")
                .find("does not fit the running state: parameter 0: 'wte' in the running state, "
                      "'renamed' in the new plugin"),
            std::string::npos)
      << ups[1];
  EXPECT_TRUE(incidents_of(r, "update").empty());
}

TEST(HotUpdate, ALazyUpdateRidesTheNextRecovery) {
  std::string dir = temp_dir("update-lazy");
  // The crash is injected only once every rank has checked the update (its `staged` event),
  // some steps ahead of the job: a crash injected beside the request could come before the
  // checks on a loaded machine, and that recovery would rightly go without the update.
  Ctl update, inject;
  int64_t crash_step = -1;
  std::string job_dir;
  const JobRun r = run_launch_job(
      dir, job_args(dir, " --fault slow@step=0,rank=0,delay_ms=20 --set detect.slow_round_steps=0"),
      [&](pid_t) {
        if (crash_step >= 0) return;
        if (job_dir.empty()) job_dir = launched_job_dir(dir);
        if (job_dir.empty()) return;
        const int step = launched_job_step(job_dir);
        if (update.rc < 0) {
          if (step >= 20)
            update = run_ctl(dir, job_dir,
                             "update --lazy --plugin " + bin_dir() + "/libkeel_gpt_proxy.so");
          return;
        }
        if (step < 0 || !contains(read_text(job_dir + "/events.jsonl"), "\"outcome\":\"staged\""))
          return;
        crash_step = step + 40;
        inject =
            run_ctl(dir, job_dir, "inject crash@step=" + std::to_string(crash_step) + ",rank=3");
      },
      300);
  ASSERT_EQ(update.rc, 0) << update.out;
  ASSERT_GE(crash_step, 0) << "the update was never staged\n"
                           << read_text(job_dir + "/events.jsonl");
  ASSERT_EQ(inject.rc, 0) << inject.out;
  expect_bitwise_and_whole(r);
  const std::vector<std::string> ups = json_object_array(r.report, "updates");
  ASSERT_EQ(ups.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(ups[0], "outcome"), "applied") << ups[0];
  EXPECT_EQ(json_string_field(ups[0], "mode"), "lazy") << ups[0];
  EXPECT_EQ(json_string_field(ups[0], "applied_step"), std::to_string(crash_step)) << ups[0];
  // The recovery it rode: rank 3 crashed as it began the crash step and was restarted in its
  // slot with the new code, loading that step from its own snapshot; no other rank could
  // complete the step without it, so each went on from its live state, not from step 0.
  const std::vector<std::string> crash = incidents_of(r, "crash");
  ASSERT_EQ(crash.size(), 1u) << r.report;
  EXPECT_EQ(json_number_field(crash[0], "rank"), 3) << crash[0];
  expect_restored(crash[0], {.step = int(crash_step),
                             .from = "memory",
                             .world = 8,
                             .ranks = {{3, "own_snapshot"}},
                             .others = "memory"});
}

TEST(HotUpdate, AStandbyPromotedAfterAnUpdateRunsTheNewCode) {
  std::string dir = temp_dir("update-standby");
  std::vector<Ctl> ctl;
  JobRun r = run_with(dir, std::string("--set detect.slot_timeout_ms=1000") + kPaced,
                      {"update --plugin " + bin_dir() + "/libkeel_gpt_proxy.so",
                       "inject slot_loss@step=200,rank=5"},
                      &ctl);
  ASSERT_EQ(ctl[0].rc, 0) << ctl[0].out;
  expect_bitwise_and_whole(r);
  const std::vector<std::string> ups = json_object_array(r.report, "updates");
  ASSERT_EQ(ups.size(), 1u) << r.report;
  const std::string hash = json_string_field(ups[0], "hash");
  // Slot 2 (ranks 4 and 5) was lost as rank 5 began step 200: the standby loaded the step for
  // ranks 4 and 5 from their backup holders, every other rank went on from its own state, not
  // from step 0. Step 200, or 199 where rank 4, killed with rank 5, had not yet finished step
  // 199's last collective and the survivors gave that step up (a matter of timing; those that
  // did complete it load 199 from their own snapshots).
  const std::vector<std::string> lost = incidents_of(r, "slot_loss");
  ASSERT_EQ(lost.size(), 1u) << r.report;
  expect_restored(lost[0], {.min_step = 199,
                            .max_step = 200,
                            .from = "memory",
                            .world = 8,
                            .ranks = {{4, "backup"}, {5, "backup"}},
                            .others = "memory|own_snapshot"});
  EXPECT_EQ(json_array_field(lost[0], "standbys_promoted"), std::vector<double>{4}) << lost[0];
  // The standby that took ranks 4 and 5 loaded the job's current plugin when promoted.
  std::string logs;
  for (const auto& job : std::filesystem::directory_iterator(dir + "/runs"))
    for (const auto& f : std::filesystem::directory_iterator(job.path() / "logs"))
      if (f.path().filename().string().rfind("slot4-standby", 0) == 0) {
        std::ifstream in(f.path());
        std::stringstream ss;
        ss << in.rdbuf();
        logs += ss.str();
      }
  EXPECT_NE(logs.find("(build " + hash + ")"), std::string::npos) << logs;
}

}  // namespace
}  // namespace keel::test
