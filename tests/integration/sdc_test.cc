// Silent data corruption (issue: SDC), with real processes: a TP2×PP2×DP2 job under
// keel-launch (4 slots of 2 workers, 2 standby slots), one rank made silently wrong by an sdc
// fault. The in-flight check must catch it within two check periods and name the rank, the
// job must evict its slot and roll back to a verified step (not to step 0: the restore point
// and every rank's source are asserted), and end bitwise equal to the fault-free run.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

constexpr int kSteps = 30;
constexpr int kEvery = 5;  // checks run in the steps with (step + 1) % 5 == 0 (0-based)

std::string job_args(const std::string& dir, const std::string& extra, int steps = kSteps,
                     TestModel model = TestModel::kGpt) {
  std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}}, model);
  return "--config " + cfg +
         " --local 6 --workers-per-slot 2 --standby 2 --set train.eval_every=0" +
         " --set train.steps=" + std::to_string(steps) +
         " --set sdc.check_every_steps=" + std::to_string(kEvery) +
         " --set parallel.comm_timeout_ms=60000 " + extra;
}

JobRun run_fault_free(TestModel model) {
  std::string dir = temp_dir("sdc-clean-" + test_model_name(model));
  return run_launch_job(dir, job_args(dir, "", kSteps, model));
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

std::vector<std::string> sdc_incidents(const JobRun& r) {
  std::vector<std::string> out;
  for (const auto& i : json_object_array(r.report, "incidents"))
    if (json_string_field(i, "kind") == "sdc") out.push_back(i);
  return out;
}

struct Case {
  const char* name;
  const char* fault;  // --fault value
  int rank, step;     // the fault's
  const char* found_by;
  TestModel model = TestModel::kGpt;
};

// GoogleTest shows a case by its name and fault (the raw bytes of its pointers otherwise,
// which change from build to build and so would CTest's test names).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " (" << c.fault << ")";
}

class SdcCaught : public testing::TestWithParam<Case> {};

// Caught within two check periods of the fault, the rank named, its slot evicted for a
// standby, every rank back at the verified step before the fault (the survivors from their
// own snapshot, the moved ranks from their replica), and the run bitwise the fault-free one.
TEST_P(SdcCaught, NamedEvictedRolledBackAndBitwiseEqual) {
  const Case& c = GetParam();
  const JobRun& base = fault_free(c.model);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  EXPECT_TRUE(sdc_incidents(base).empty()) << base.report;
  std::string dir = temp_dir(std::string("sdc-") + c.name);
  JobRun r = run_launch_job(dir, job_args(dir, std::string("--fault ") + c.fault, kSteps, c.model));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), kSteps);
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(base.report, "param_checksum"))
      << r.output;
  std::vector<std::string> inc = sdc_incidents(r);
  ASSERT_EQ(inc.size(), 1u) << r.report;
  const std::string& i = inc[0];
  EXPECT_EQ(json_number_field(i, "rank"), c.rank) << i;
  EXPECT_EQ(json_string_field(i, "found_by"), c.found_by) << i;
  const double caught = json_number_field(i, "step");
  EXPECT_GE(caught, c.step) << i;
  EXPECT_LE(caught, c.step + 2 * kEvery) << i;
  // The newest verified step before the fault, and from memory: not a restart from step 0.
  // Every fault here (from step 12 to 14) is caught by the check of step 14 (see the cases
  // below), so the newest verified step is step 9, whose check passed. The culprit and its
  // slot-mate moved to the standby and load their replicas' backups; the others roll back to
  // their own snapshots.
  EXPECT_EQ(json_number_field(i, "restored_step"), json_number_field(i, "verified_step")) << i;
  const int mate = c.rank % 2 == 0 ? c.rank + 1 : c.rank - 1;  // the culprit's slot-mate
  expect_restored(i, {.step = 2 * kEvery - 1,
                      .from = "memory",
                      .world = 8,
                      .ranks = {{c.rank, "backup"}, {mate, "backup"}},
                      .others = "own_snapshot"});
  EXPECT_EQ(json_string_field(i, "rung"), "evict") << i;
  EXPECT_EQ(json_array_field(i, "standbys_promoted").size(), 1u) << i;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// Persistent faults from step 12 are first checked at step 14; `once` faults sit where a check
// covers them: a gradient or activation flip in a check step's first micro-batch, a parameter
// or moment flip right before a check step (the check finds the memory changed at rest).
// The Llama job's persistent gradient fault goes the longest way: the replicas tie, every rank
// runs the golden check (keel's GPT, whatever the job trains) and the culprit's unit fails it;
// its standby passed the same check to be ready at all.
INSTANTIATE_TEST_SUITE_P(
    Targets, SdcCaught,
    testing::Values(Case{"grad", "sdc@step=12,rank=5", 5, 12, "golden"},
                    Case{"grad_once", "sdc@step=14,rank=5,once", 5, 14, "recompute_again"},
                    Case{"activation", "sdc@step=12,rank=2,target=activation", 2, 12, "golden"},
                    Case{"activation_once", "sdc@step=14,rank=2,target=activation,once", 2, 14,
                         "recompute_again"},
                    Case{"param", "sdc@step=12,rank=5,target=param", 5, 12, "at_rest"},
                    Case{"param_once", "sdc@step=13,rank=5,target=param,once", 5, 13, "at_rest"},
                    Case{"optimizer", "sdc@step=12,rank=6,target=optimizer", 6, 12, "at_rest"},
                    Case{"optimizer_once", "sdc@step=13,rank=6,target=optimizer,once", 6, 13,
                         "at_rest"},
                    Case{"llama_grad", "sdc@step=12,rank=5", 5, 12, "golden", TestModel::kLlama}),
    [](const testing::TestParamInfo<Case>& p) { return std::string(p.param.name); });

// Coverage rule: the recompute compares the first micro-batch of check steps only. A transient
// gradient flip in another step is averaged into every replica's update alike, so no check can
// see it: the report lists it as missed, with the rule, and raises no incident.
TEST(Sdc, TransientFlipBetweenChecksIsReportedMissed) {
  std::string dir = temp_dir("sdc-missed");
  JobRun r = run_launch_job(dir, job_args(dir, "--fault sdc@step=12,rank=5,once"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(sdc_incidents(r).empty()) << r.report;
  const std::string missed = r.report.substr(r.report.find("\"sdc_missed\""));
  EXPECT_NE(missed.find("sdc on rank 5 at step 13"), std::string::npos) << r.report;
  EXPECT_NE(missed.find("multiples of 5"), std::string::npos) << r.report;
}

// Coverage rule: a transient parameter flip two steps before a check is rewritten by the next
// updates (its snapshot checksum is fresh again), so only agreement sees it, and two replicas
// that disagree have no majority; the golden check passes on both (a transient does not
// repeat), and neither does the stop-time replay on groups of machines. The job rolls back to
// verified state without evicting anyone, and still ends bitwise equal.
TEST(Sdc, UnattributedDisagreementRollsBackWithoutEviction) {
  ASSERT_EQ(fault_free().exit_code, 0) << fault_free().output;
  std::string dir = temp_dir("sdc-unattributed");
  JobRun r = run_launch_job(dir, job_args(dir, "--fault sdc@step=11,rank=5,target=param,once"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> inc = sdc_incidents(r);
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_number_field(inc[0], "rank"), -1) << inc[0];
  EXPECT_EQ(json_string_field(inc[0], "rung"), "rollback") << inc[0];
  EXPECT_TRUE(json_array_field(inc[0], "standbys_promoted").empty()) << inc[0];
  // Every rank rolls back to the verified step from its own snapshot: nobody moved.
  expect_restored(inc[0], {.step = 9, .from = "memory", .world = 8, .others = "own_snapshot"});
  // The stop-time replay ran and found every machine healthy: the flip did not repeat.
  EXPECT_NE(json_string_field(inc[0], "detail").find("no machine failed in both phases"),
            std::string::npos)
      << inc[0];
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(fault_free().report, "param_checksum"));
}

// No false alarm: a long fault-free run with frequent checks raises no SDC incident, and the
// report counts the checks and says what they cover.
TEST(Sdc, ThousandCleanStepsRaiseNothing) {
  std::string dir = temp_dir("sdc-long");
  // The fail-slow rules are off (detect.slow_round_steps=0): they judge step times, which a
  // machine's changing load moves in a 1000-step run ("the whole job slowed down"), and
  // fail_slow_test.cc tests them. What is left can only be the SDC checks' doing.
  JobRun r = run_launch_job(dir, job_args(dir, "--set detect.slow_round_steps=0", 1000), {}, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(json_object_array(r.report, "incidents").empty()) << r.report;
  EXPECT_EQ(json_number_field(r.report, "sdc_checks"), 1000 / kEvery);
  EXPECT_NE(json_string_field(r.report, "sdc_coverage").find("recompute"), std::string::npos);
  EXPECT_GT(json_number_field(r.report, "sdc_check_seconds"), 0);
}

}  // namespace
}  // namespace keel::test

namespace keel::test {
namespace {

// With ZeRO-1 no replica holds a rank's moments, so backups are pushed to a holder: the
// verified snapshot is pushed there too, and the moved rank restores it from the holder.
TEST(Sdc, WithZeroOneTheMovedRankRestoresItsVerifiedStateFromItsHolder) {
  auto args = [](const std::string& dir, const std::string& extra) {
    std::string cfg = write_config(dir, {{"parallel", "dp: 2 zero1: true"}});
    return "--config " + cfg + " --local 3 --standby 1 --set train.eval_every=0" +
           " --set train.steps=" + std::to_string(kSteps) +
           " --set sdc.check_every_steps=" + std::to_string(kEvery) + " " + extra;
  };
  std::string clean_dir = temp_dir("sdc-zero1-clean");
  JobRun clean = run_launch_job(clean_dir, args(clean_dir, ""));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  std::string dir = temp_dir("sdc-zero1");
  JobRun r = run_launch_job(dir, args(dir, "--fault sdc@step=12,rank=1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "backup_mode"), "pushed");
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(clean.report, "param_checksum"));
  std::vector<std::string> inc = sdc_incidents(r);
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_number_field(inc[0], "rank"), 1) << inc[0];
  expect_restored(
      inc[0],
      {.step = 9, .from = "memory", .world = 2, .ranks = {{0, "own_snapshot"}, {1, "backup"}}});
  EXPECT_NE(json_string_field(r.report, "sdc_coverage").find("ZeRO-1"), std::string::npos);
}

}  // namespace
}  // namespace keel::test

namespace keel::test {
namespace {

// The stop-time dual-phase replay with the in-flight checks off: rank 5's machine (slot 2)
// computes its gradients wrong from step 3, which nothing notices; an operator's keel-ctl
// replay stops the job, replays one step on three groups of two machines (the four active
// slots and the two standbys), contiguous then strided, and pins slot 2: it is evicted for a
// standby and the job finishes.
TEST(Sdc, ReplayWithTheChecksOffPinsTheDefectiveMachine) {
  constexpr int kLong = 400;
  std::string dir = temp_dir("sdc-replay");
  std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}});
  const std::string args = "--config " + cfg +
                           " --local 6 --workers-per-slot 2 --standby 2 --set train.eval_every=0"
                           " --set train.steps=" +
                           std::to_string(kLong) +
                           " --set sdc.check_every_steps=0 --fault sdc@step=3,rank=5";
  std::string out, job_dir;
  int rc = -1;
  JobRun r = run_launch_job(
      dir, args,
      [&](pid_t) {
        if (rc >= 0) return;
        if (job_dir.empty()) job_dir = launched_job_dir(dir);
        if (job_dir.empty() || launched_job_step(job_dir) < 10) return;
        // The replay needs three groups of machines, the two standbys among them: on a loaded
        // machine their self-checks may still run at step 10.
        const std::string status_file = dir + "/status.out";
        std::system(
            (bin_dir() + "/keel-ctl status --run " + job_dir + " > " + status_file + " 2>&1")
                .c_str());
        const std::string status = read_text(status_file);
        size_t ready = 0;
        for (size_t at = status.find("self-check ok"); at != std::string::npos;
             at = status.find("self-check ok", at + 1))
          ++ready;
        if (ready < 2) return;
        rc = std::system(
            (bin_dir() + "/keel-ctl replay --run " + job_dir + " > " + dir + "/ctl.out 2>&1")
                .c_str());
        std::ifstream in(dir + "/ctl.out");
        std::stringstream ss;
        ss << in.rdbuf();
        out = ss.str();
      },
      300);
  ASSERT_EQ(rc, 0) << out;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), kLong);
  std::vector<std::string> inc = sdc_incidents(r);
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "found_by"), "replay") << inc[0];
  EXPECT_EQ(json_number_field(inc[0], "rank"), -1) << inc[0];  // a machine, not a rank
  EXPECT_EQ(json_number_field(inc[0], "slot"), 2) << inc[0];
  EXPECT_GT(json_number_field(inc[0], "injected_at"), 0) << inc[0];
  // Nothing was verified with the checks off: the job goes on from its newest step.
  EXPECT_EQ(json_string_field(inc[0], "action").find("verified"), std::string::npos) << inc[0];
  EXPECT_EQ(json_array_field(inc[0], "slots_evicted"), std::vector<double>{2}) << inc[0];
  EXPECT_NE(
      json_string_field(inc[0], "detail").find("the machine in a failing group of both: slot 2"),
      std::string::npos)
      << inc[0];
  // From memory, not from step 0: slot 2's ranks (4 and 5) load their backups on a standby,
  // the others their own state. The step varies with when keel-ctl replay stopped the job
  // (whenever the test got to ask): the newest step in flight (the incident's step), or the
  // one before where the stop found some ranks past it and others still in it (those past it
  // load the step before from their own snapshots).
  const int in_flight = int(json_number_field(inc[0], "step"));
  expect_restored(inc[0], {.min_step = in_flight - 1,
                           .max_step = in_flight,
                           .from = "memory",
                           .world = 8,
                           .ranks = {{4, "backup"}, {5, "backup"}},
                           .others = "memory|own_snapshot"});
  EXPECT_GE(in_flight, 10) << inc[0];
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

}  // namespace
}  // namespace keel::test
