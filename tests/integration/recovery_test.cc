// Surviving failures end to end (issue: crashed rank): a TP2×PP2×DP2 job under
// `keel-worker --nproc 8` loses a rank to a real SIGKILL, a real exit, a real hang, a
// corrupted or deleted snapshot, and must finish with the parameters of the same job
// without faults, bit for bit, with the surviving processes never restarted and nothing
// (process or shared memory) left behind.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 12;

std::string job_args(const std::string& dir, const std::string& extra = "") {
  std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}});
  return "--config " + cfg + " --nproc 8 --set train.steps=" + std::to_string(kSteps) +
         " --set parallel.comm_timeout_ms=3000 --set recovery.abort_timeout_ms=1500 " + extra;
}

// The same job without faults, run once per test binary.
const JobRun& fault_free() {
  static const JobRun r = [] {
    std::string dir = temp_dir("fault-free");
    return run_job(dir, job_args(dir));
  }();
  return r;
}

void expect_clean(const JobRun& r) {
  EXPECT_EQ(r.leftover_processes, 0) << "processes outlived the job\n" << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << "shared memory left behind: " << r.leftover_shm.size()
                                      << " segment(s), e.g. " << r.leftover_shm[0];
}

// Finished, bitwise equal to the fault-free run, one incident on `culprit` that lost at most
// one step and restored the state `where` says (a restart from step 0 is bitwise equal too),
// every other rank served by one process all along.
void expect_recovered(const JobRun& r, int culprit, const std::string& kind,
                      const RestorePoint& where) {
  const JobRun& base = fault_free();
  ASSERT_EQ(base.exit_code, 0) << base.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(base.report, "param_checksum"))
      << r.output;
  EXPECT_EQ(json_array_field(r.report, "losses"), json_array_field(base.report, "losses"));
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "kind"), kind) << inc[0];
  EXPECT_EQ(json_number_field(inc[0], "rank"), culprit) << inc[0];
  EXPECT_LE(json_number_field(inc[0], "steps_lost"), 1) << inc[0];
  expect_restored(inc[0], where);
  const double detected = json_number_field(inc[0], "detected_at");
  EXPECT_GT(detected, 0) << inc[0];
  EXPECT_GE(json_number_field(inc[0], "recovered_at"), detected) << inc[0];
  EXPECT_GE(json_number_field(inc[0], "first_step_at"), json_number_field(inc[0], "recovered_at"))
      << inc[0];
  std::vector<std::string> ranks = json_object_array(r.report, "ranks");
  ASSERT_EQ(ranks.size(), 8u);
  for (int k = 0; k < 8; ++k) {
    const size_t pids = json_array_field(ranks[size_t(k)], "pids").size();
    EXPECT_EQ(pids, k == culprit ? 2u : 1u) << "rank " << k << ": " << ranks[size_t(k)];
  }
  expect_clean(r);
}

// In place: the culprit loads the step from its own snapshot, every other rank keeps it in
// memory.
RestorePoint in_place(int step, int culprit, const std::string& culprit_source = "own_snapshot") {
  return {.step = step,
          .from = "memory",
          .world = 8,
          .ranks = {{culprit, culprit_source}},
          .others = "memory"};
}

int random_step() {
  std::random_device rd;
  return 2 + int(rd() % (kSteps - 4));  // leave a step before and a few after
}

// Repeatable: a second run of the same job ends with the same parameters and losses, bit
// for bit.
TEST(Recovery, FaultFreeJobIsCleanAndRepeatable) {
  const JobRun& a = fault_free();
  ASSERT_EQ(a.exit_code, 0) << a.output;
  expect_clean(a);
  EXPECT_TRUE(json_object_array(a.report, "incidents").empty());
  EXPECT_NEAR(json_number_field(a.report, "ettr"), 0.5, 0.5);
  const std::string dir = temp_dir("fault-free-again");
  const JobRun b = run_job(dir, job_args(dir));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  expect_clean(b);
  EXPECT_TRUE(json_object_array(b.report, "incidents").empty()) << b.report;
  EXPECT_EQ(json_number_field(b.report, "steps_completed"), kSteps);
  EXPECT_EQ(json_string_field(b.report, "param_checksum"),
            json_string_field(a.report, "param_checksum"));
  EXPECT_EQ(json_array_field(b.report, "losses"), json_array_field(a.report, "losses"));
}

TEST(Recovery, CrashedRankIsRestartedInPlace) {
  const int step = random_step();
  SCOPED_TRACE("crash at step " + std::to_string(step));
  std::string dir = temp_dir("crash");
  JobRun r = run_job(dir, job_args(dir, "--fault crash@step=" + std::to_string(step) + ",rank=5"));
  expect_recovered(r, 5, "crash", in_place(step, 5));
}

TEST(Recovery, ExitedRankIsRestartedInPlace) {
  std::string dir = temp_dir("exit");
  JobRun r = run_job(dir, job_args(dir,
                                   "--fault 'exit@step=6,rank=2,code=1,message=CUDA error: "
                                   "an illegal memory access was encountered'"));
  expect_recovered(r, 2, "exit", in_place(6, 2));
  EXPECT_TRUE(contains(r.output, "illegal memory access")) << r.output;
}

// The stalled rank that is not waiting inside a collective while the others are is the
// culprit, found from the ranks' progress reports before any communicator times out.
TEST(Recovery, HungRankIsFoundByProgressKilledAndRestarted) {
  std::string dir = temp_dir("hang");
  JobRun r =
      run_job(dir, job_args(dir,
                            "--fault hang@step=4,rank=6 --set "
                            "parallel.comm_timeout_ms=60000 --set detect.hang_grace_ms=1000"));
  expect_recovered(r, 6, "hang", in_place(4, 6));
  EXPECT_TRUE(contains(r.output, "rank 6 has not entered")) << r.output;
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u);
  // Found by the progress rule, not by the 60 s communicator timeout (whose rule would be
  // another), after the hang began.
  EXPECT_EQ(json_string_field(inc[0], "rule"), "not_in_collective") << inc[0];
  EXPECT_GE(json_number_field(inc[0], "detected_at"), json_number_field(inc[0], "injected_at"))
      << inc[0];
}

// Without progress-based detection the communicator timeout finds it: the peers time out,
// the controller aborts the epoch, and the rank that does not answer is killed.
TEST(Recovery, HungRankIsFoundByTheCommunicatorTimeout) {
  std::string dir = temp_dir("hang-timeout");
  JobRun r = run_job(dir, job_args(dir, "--fault hang@step=4,rank=6 --set detect.hang_grace_ms=0"));
  expect_recovered(r, 6, "hang", in_place(4, 6));
  EXPECT_TRUE(contains(r.output, "did not answer the abort")) << r.output;
}

TEST(Recovery, CorruptSnapshotSlotFallsBackToAnotherCopy) {
  std::string dir = temp_dir("corrupt");
  JobRun r = run_job(dir, job_args(dir, "--fault corrupt_snapshot@step=7,rank=1"));
  expect_recovered(r, 1, "corrupt_snapshot", in_place(7, 1, "backup"));
  EXPECT_TRUE(contains(r.output, "checksum mismatch")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1: restored step")) << r.output;
}

// Without ZeRO-1 the backup of rank 4 = (t0, d0, p1) is the own snapshot of its replica
// rank 6 = (t0, d1, p1): nothing is pushed, and the state lives in its two slots, so the
// rank's snapshots take twice its state in host memory, plus the SDC checks' verified slot
// (on by default in deterministic mode), and no more.
TEST(Recovery, LostSharedMemoryIsRestoredFromTheBackupHolder) {
  std::string dir = temp_dir("lose");
  JobRun r = run_job(dir, job_args(dir, "--fault lose_snapshot@step=5,rank=4"));
  expect_recovered(r, 4, "lose_snapshot", in_place(5, 4, "backup"));
  EXPECT_TRUE(contains(r.output, "rank 4: restored step")) << r.output;
  EXPECT_TRUE(contains(r.output, "backup held by rank 6")) << r.output;
  EXPECT_EQ(json_string_field(r.report, "backup_mode"), "replica") << r.report;
  EXPECT_EQ(json_number_field(r.report, "backup_bytes_per_step"), 0) << r.report;
  EXPECT_TRUE(contains(r.report, "\"snapshot_in_slots\": true")) << r.report;
  // Two slots, the verified one and a page of header.
  EXPECT_LT(json_number_field(r.report, "state_host_ratio"), 3.05) << r.report;
}

// With ZeRO-1 the replicas hold different moment shards, so each snapshot is pushed to the
// holder (d+1, p+1, t): rank 4's is rank 2.
TEST(Recovery, WithZeroOneTheBackupIsPushedAndRestoredFromTheHolder) {
  std::string dir = temp_dir("lose-zero1");
  JobRun r =
      run_job(dir, job_args(dir, "--set parallel.zero1=true --fault lose_snapshot@step=5,rank=4"));
  expect_recovered(r, 4, "lose_snapshot", in_place(5, 4, "backup"));
  EXPECT_TRUE(contains(r.output, "backup held by rank 2")) << r.output;
  EXPECT_EQ(json_string_field(r.report, "backup_mode"), "pushed") << r.report;
  EXPECT_GT(json_number_field(r.report, "backup_bytes_per_step"), 0) << r.report;
}

TEST(Recovery, NanLossSkipsTheUpdateAndRetries) {
  std::string dir = temp_dir("nan");
  JobRun r = run_job(dir, job_args(dir, "--fault nan@step=3,rank=7"));
  const JobRun& base = fault_free();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(base.report, "param_checksum"));
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "kind"), "nan");
  EXPECT_EQ(json_number_field(inc[0], "rank"), 7);
  // Nothing is restored: the update is skipped and step 3 retried on the state every rank
  // still holds (no rank loads anything, so none names a source).
  EXPECT_EQ(json_string_field(inc[0], "action"), "update skipped; step retried") << inc[0];
  EXPECT_EQ(json_number_field(inc[0], "restored_step"), 3) << inc[0];
  EXPECT_EQ(json_number_field(inc[0], "steps_lost"), 0) << inc[0];
  EXPECT_EQ(json_string_field(inc[0], "restored_from"), "") << inc[0];
  EXPECT_TRUE(rank_sources(inc[0]).empty()) << inc[0];
  expect_clean(r);
}

// restart_all: every rank loads step 4 from the persistent checkpoint.
const RestorePoint kRestoredStep4FromCheckpoint = {
    .step = 4, .from = "persistent", .world = 8, .others = "persistent"};

// restart_all kills every rank at once and restores the newest sealed persistent checkpoint.
// Step 4's is written in the background and sealed by rank 0 once every rank's part is in:
// on a loaded machine a crash two steps later can come first, and the job then rightly stops
// (no checkpoint, no restart from scratch). Rank 3 is slow for one second in step 5 (under
// the hang rule's grace, which is off here, and the comm timeout), so that the crash comes
// after the seal.
TEST(Recovery, RestartAllFromThePersistentCheckpointIsEqualToo) {
  std::string dir = temp_dir("restart-all");
  JobRun r = run_job(
      dir,
      job_args(dir,
               "--set recovery.mode=restart_all --set checkpoint.persistent_every_steps=4 "
               "--set detect.hang_grace_ms=0 --set checkpoint.dir=" +
                   dir +
                   "/ck --fault slow@step=5,rank=3,delay_ms=1000 --fault crash@step=6,rank=3"));
  const JobRun& base = fault_free();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(base.report, "param_checksum"))
      << r.output;
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_TRUE(contains(json_string_field(inc[0], "action"), "restart all")) << inc[0];
  expect_restored(inc[0], kRestoredStep4FromCheckpoint);
  expect_clean(r);
}

// A checkpoint directory shared with an earlier run of another seed, which left newer
// checkpoints (steps 8 and 12) there: restart_all restores this job's own step 4, never the
// other run's state.
TEST(Recovery, RestartAllIgnoresANewerCheckpointOfAnotherRun) {
  std::string dir = temp_dir("restart-all-foreign");
  const std::string ck = " --set checkpoint.persistent_every_steps=4 --set checkpoint.dir=" + dir +
                         "/ck --set checkpoint.keep=0";
  JobRun other = run_job(dir, job_args(dir, "--set train.seed=99" + ck));
  ASSERT_EQ(other.exit_code, 0) << other.output;
  ASSERT_TRUE(fs::exists(dir + "/ck/step_000012/manifest.pb"));
  JobRun r = run_job(
      dir, job_args(dir, "--set recovery.mode=restart_all --fault crash@step=6,rank=3" + ck));
  const JobRun& base = fault_free();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(base.report, "param_checksum"))
      << r.output;
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  expect_restored(inc[0], kRestoredStep4FromCheckpoint);
  expect_clean(r);
}

// A job stopped by SIGTERM (its ranks stop with it, nothing is left behind) and resumed
// from its persistent checkpoints ends where the uninterrupted job ends; a truncated newest
// checkpoint is skipped by name and the one before it used.
TEST(Recovery, StoppedJobResumesFromItsCheckpoints) {
  std::string dir = temp_dir("resume");
  const std::string ck = dir + "/ck";
  const std::string args =
      job_args(dir, "--set checkpoint.persistent_every_steps=3 --set checkpoint.dir=" + ck);
  bool sent = false;
  JobRun stopped = run_job(dir, args, [&](pid_t pid) {
    if (!sent && fs::exists(ck + "/step_000006/manifest.pb")) {
      kill(pid, SIGTERM);
      sent = true;
    }
  });
  ASSERT_TRUE(sent) << stopped.output;
  EXPECT_EQ(stopped.exit_code, 128 + SIGTERM) << stopped.output;
  expect_clean(stopped);

  // The sealed checkpoints the stopped job left: a resume starts at the newest one (an
  // ignored --resume would start at step 0 and end bitwise equal all the same).
  auto sealed = [&] {
    std::vector<fs::path> steps;
    for (const auto& e : fs::directory_iterator(ck))
      if (fs::exists(e.path() / "manifest.pb")) steps.push_back(e.path());
    std::sort(steps.begin(), steps.end());
    return steps;
  };
  auto step_of = [](const fs::path& p) { return std::stoi(p.filename().string().substr(5)); };
  const std::vector<fs::path> left = sealed();
  ASSERT_FALSE(left.empty());

  JobRun resumed = run_job(dir, args + " --resume " + ck);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const JobRun& base = fault_free();
  EXPECT_EQ(json_string_field(resumed.report, "param_checksum"),
            json_string_field(base.report, "param_checksum"))
      << resumed.output;
  expect_resumed(resumed.report, step_of(left.back()), kSteps);
  expect_clean(resumed);

  // Truncate rank 3's file of the newest checkpoint: the one before it is used.
  const std::vector<fs::path> steps = sealed();
  ASSERT_GE(steps.size(), 2u);
  const fs::path newest = steps.back() / "rank_3.bin";
  fs::resize_file(newest, fs::file_size(newest) / 2);
  JobRun fallback = run_job(dir, args + " --resume " + ck);
  ASSERT_EQ(fallback.exit_code, 0) << fallback.output;
  EXPECT_TRUE(contains(fallback.output, steps.back().filename().string() + "/rank_3.bin"))
      << fallback.output;
  EXPECT_EQ(json_string_field(fallback.report, "param_checksum"),
            json_string_field(base.report, "param_checksum"));
  expect_resumed(fallback.report, step_of(steps[steps.size() - 2]), kSteps);
  expect_clean(fallback);
}

}  // namespace
}  // namespace keel::test
