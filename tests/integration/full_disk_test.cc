// A full disk never fails a finished run (issue 18): persistent checkpoints go to a small tmpfs
// the test mounts itself. A write that fails is an incident of its own
// (checkpoint_write_failed), never a crash of the rank; training goes on (warn) or the job
// ends after it with its report and exit 5 (stop); no temporary file is left on the disk.
// Under keel-worker alone, keel-worker --nproc 2 and keel-launch --local 2. The tests skip
// where a tmpfs cannot be mounted (no CAP_SYS_ADMIN).
#include <sys/mount.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "launcher/exit_codes.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 20, kEvery = 5;

// Every file under `dir`, for the messages.
// Every file under `dir` but the owner lock a job holds on its checkpoint directory
// (ckpt/checkpoint_dir_lock.h), which stays by design.
std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.path().filename() != ".keel-owner") out.push_back(e.path().string());
  return out;
}

std::vector<std::string> tmp_files_under(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& f : files_under(dir))
    if (f.size() > 4 && f.compare(f.size() - 4, 4, ".tmp") == 0) out.push_back(f);
  return out;
}

// Every file under a keel-launch run directory, concatenated: the ranks' logs.
std::string run_logs(const std::string& runs) {
  std::string all;
  for (const auto& f : files_under(runs)) {
    if (!fs::is_regular_file(f)) continue;
    std::ifstream in(f);
    all.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return all;
}

// A tmpfs of `size` mounted at DIR/mnt for the test, unmounted however the test ends.
class FullDisk : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = temp_dir("full-disk"); }
  void TearDown() override { unmount(); }

  // False (and the test is skipped) where mounting is not allowed.
  bool mount_tmpfs(const std::string& size) {
    unmount();
    mnt_ = dir_ + "/mnt";
    fs::create_directories(mnt_);
    const std::string opts = "size=" + size;
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
      skip_why_ = "cannot mount a tmpfs at " + mnt_ + ": " + std::strerror(errno) +
                  " (the test needs root or CAP_SYS_ADMIN)";
      return false;
    }
    mounted_ = true;
    return true;
  }
  void unmount() {
    if (!mounted_) return;
    EXPECT_EQ(::umount2(mnt_.c_str(), MNT_DETACH), 0) << mnt_ << ": " << std::strerror(errno);
    mounted_ = false;
  }

  std::string job_args(const std::string& on_error, const std::string& parallel,
                       const std::string& extra = "") {
    const std::string cfg = write_config(dir_, {{"parallel", parallel}});
    return "--config " + cfg + " --set train.steps=" + std::to_string(kSteps) +
           " --set train.eval_every=0 --set checkpoint.persistent_every_steps=" +
           std::to_string(kEvery) + " --set checkpoint.dir=" + mnt_ +
           " --set checkpoint.on_write_error=" + on_error + " " + extra;
  }

  std::string dir_, mnt_, skip_why_;
  bool mounted_ = false;
};

// What every run on the full disk must show: a report, checkpoint incidents naming the step,
// the path and the error, no crash or exit incident, nothing left behind.
// `log`: where the ranks' lines go (the job's output; keel-launch: its run directory's logs).
void expect_checkpoint_failures(const JobRun& r, const std::string& mnt, int ranks,
                                const std::string& log) {
  ASSERT_FALSE(r.report.empty()) << "no report\n" << r.output;
  const std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_FALSE(inc.empty()) << r.report;
  for (const auto& i : inc) {
    EXPECT_EQ(json_string_field(i, "kind"), "checkpoint_write_failed") << i;
    const std::string detail = json_string_field(i, "detail");
    const int step = int(json_number_field(i, "step"));
    EXPECT_EQ(step % kEvery, 0) << i;
    char name[32];
    std::snprintf(name, sizeof(name), "step_%06d", step);
    EXPECT_TRUE(contains(detail, "persistent checkpoint of step " + std::to_string(step)) &&
                contains(detail, mnt + "/" + name + "/rank_") &&
                contains(detail, "No space left on device"))
        << detail;
    EXPECT_GE(json_number_field(i, "rank"), 0) << i;
    EXPECT_LT(json_number_field(i, "rank"), ranks) << i;
  }
  EXPECT_EQ(json_number_field(r.report, "checkpoint_write_failures"), double(inc.size()));
  EXPECT_TRUE(
      contains(json_string_field(r.report, "checkpoint_last_error"), "No space left on device"))
      << r.report;
  // The step in flight when each write failed is named at once, not an interval later.
  EXPECT_TRUE(contains(log, "persistent checkpoint of step 5 not written")) << log;
  EXPECT_TRUE(tmp_files_under(mnt).empty()) << tmp_files_under(mnt)[0];
  // 64 KiB holds no rank file: every step directory, partial, is removed.
  EXPECT_TRUE(files_under(mnt).empty()) << files_under(mnt)[0];
  EXPECT_EQ(r.leftover_processes, 0) << "processes outlived the job\n" << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << "shared memory left behind: " << r.leftover_shm[0];
}

// warn: every step is trained and the run succeeds; every interval tried again (4 saves, each
// failing on every rank).
void expect_warned(const JobRun& r, const std::string& mnt, int ranks, const std::string& log) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_checkpoint_failures(r, mnt, ranks, log);
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), kSteps) << r.output;
  EXPECT_EQ(json_array_field(r.report, "losses").size(), size_t(kSteps));
  EXPECT_EQ(json_object_array(r.report, "incidents").size(), size_t(ranks * kSteps / kEvery))
      << r.report;
  EXPECT_EQ(r.report.find("\"stopped_on_checkpoint_error\": true"), std::string::npos);
}

// stop: the job ends soon after the first failed write (step 5), every rank alike, with its
// report covering the steps it ran, and exit 5.
void expect_stopped(const JobRun& r, const std::string& mnt, int ranks, const std::string& log) {
  EXPECT_EQ(r.exit_code, kExitWriteFailed) << r.output;
  expect_checkpoint_failures(r, mnt, ranks, log);
  const double steps = json_number_field(r.report, "steps_completed");
  EXPECT_GE(steps, kEvery) << r.output;
  EXPECT_LT(steps, 2 * kEvery) << r.output;
  EXPECT_EQ(json_array_field(r.report, "losses").size(), size_t(steps));
  EXPECT_TRUE(contains(r.report, "\"stopped_on_checkpoint_error\": true")) << r.report;
  EXPECT_TRUE(contains(log, "checkpoint.on_write_error: stop")) << log;
}

TEST_F(FullDisk, SingleProcessWarnTrainsEveryStep) {
  if (!mount_tmpfs("64k")) GTEST_SKIP() << skip_why_;
  const JobRun r = run_job(dir_, job_args("warn", ""));
  expect_warned(r, mnt_, 1, r.output);
}

TEST_F(FullDisk, SingleProcessStopEndsWithItsReport) {
  if (!mount_tmpfs("64k")) GTEST_SKIP() << skip_why_;
  const JobRun r = run_job(dir_, job_args("stop", ""));
  expect_stopped(r, mnt_, 1, r.output);
}

TEST_F(FullDisk, TwoRanksWarnTrainEveryStepWithoutRestarts) {
  if (!mount_tmpfs("64k")) GTEST_SKIP() << skip_why_;
  const JobRun r = run_job(dir_, "--nproc 2 " + job_args("warn", "dp: 2"));
  expect_warned(r, mnt_, 2, r.output);
}

TEST_F(FullDisk, TwoRanksStopTogetherWithTheReport) {
  if (!mount_tmpfs("64k")) GTEST_SKIP() << skip_why_;
  const JobRun r = run_job(dir_, "--nproc 2 " + job_args("stop", "dp: 2"));
  expect_stopped(r, mnt_, 2, r.output);
}

TEST_F(FullDisk, LaunchedJobWarnTrainsEveryStep) {
  if (!mount_tmpfs("64k")) GTEST_SKIP() << skip_why_;
  const JobRun r = run_launch_job(dir_, "--local 2 " + job_args("warn", "dp: 2"));
  expect_warned(r, mnt_, 2, run_logs(dir_ + "/runs"));
}

TEST_F(FullDisk, LaunchedJobStopsWithTheReport) {
  if (!mount_tmpfs("64k")) GTEST_SKIP() << skip_why_;
  const JobRun r = run_launch_job(dir_, "--local 2 " + job_args("stop", "dp: 2"));
  expect_stopped(r, mnt_, 2, run_logs(dir_ + "/runs") + r.output);
}

// A disk with room for one checkpoint: the first is kept, every later one fails and is
// cleaned away, and the job resumes from the one that fit.
TEST_F(FullDisk, TheCheckpointThatFitIsKeptAndResumes) {
  // The size of one checkpoint of this job, measured on an ordinary disk.
  const std::string probe = dir_ + "/probe";
  {
    const std::string cfg = write_config(dir_);
    const JobRun p = run_job(dir_, "--config " + cfg +
                                       " --set train.steps=5 --set train.eval_every=0 "
                                       "--set checkpoint.persistent_every_steps=5 "
                                       "--set checkpoint.dir=" +
                                       probe);
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  uintmax_t bytes = 0;
  for (const auto& f : files_under(probe))
    if (fs::is_regular_file(f)) bytes += fs::file_size(f);
  ASSERT_GT(bytes, 0u);
  // Room for one and a half: the second write runs out of space in its rank file.
  if (!mount_tmpfs(std::to_string((bytes * 3 / 2 + 8191) / 4096 * 4096))) GTEST_SKIP() << skip_why_;
  const JobRun r = run_job(dir_, job_args("warn", ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), kSteps);
  EXPECT_EQ(json_number_field(r.report, "checkpoint_write_failures"), 3) << r.report;
  EXPECT_TRUE(tmp_files_under(mnt_).empty()) << tmp_files_under(mnt_)[0];
  EXPECT_TRUE(fs::exists(mnt_ + "/step_000005/manifest.pb")) << r.output;
  for (const char* later : {"/step_000010", "/step_000015", "/step_000020"})
    EXPECT_FALSE(fs::exists(mnt_ + later)) << later;

  const JobRun resumed = run_job(dir_, job_args("warn", "") + " --resume " + mnt_);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  // From the one checkpoint on the disk, step 5 (not a restart from step 0), to the end, and
  // where the uninterrupted run ended.
  expect_resumed(resumed.report, kEvery, kSteps);
  EXPECT_EQ(json_string_field(resumed.report, "param_checksum"),
            json_string_field(r.report, "param_checksum"));
  EXPECT_EQ(resumed.leftover_processes, 0);
  EXPECT_TRUE(resumed.leftover_shm.empty());
}

// --report and --loss-svg on a full disk at the end: each says which file and why, the others
// are still written (the trained weights first), and the exit code says one failed.
TEST_F(FullDisk, OutputsOnAFullDiskAreNamedAndTheWeightsKept) {
  if (!mount_tmpfs("64k")) GTEST_SKIP() << skip_why_;
  {
    std::ofstream fill(mnt_ + "/fill", std::ios::binary);
    const std::string block(4096, 'x');
    while (fill.write(block.data(), std::streamsize(block.size())) && fill.flush()) {
    }
  }
  const std::string cfg = write_config(dir_);
  const std::string weights = dir_ + "/weights.bin";
  const JobRun r = run_command(dir_, bin_dir() + "/keel-worker --quiet --config " + cfg +
                                         " --set train.steps=3 --set train.eval_every=0 --report " +
                                         mnt_ + "/report.json --loss-svg " + mnt_ +
                                         "/loss.svg --export-llmc " + weights);
  EXPECT_EQ(r.exit_code, kExitWriteFailed) << r.output;
  EXPECT_TRUE(contains(r.output, "--report " + mnt_ + "/report.json: not written: " + mnt_ +
                                     "/report.json: write: No space left on device"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "--loss-svg " + mnt_ + "/loss.svg: not written")) << r.output;
  EXPECT_FALSE(contains(r.output, "terminate called")) << r.output;
  EXPECT_TRUE(fs::exists(weights) && fs::file_size(weights) > 0) << r.output;
  EXPECT_TRUE(tmp_files_under(mnt_).empty()) << tmp_files_under(mnt_)[0];
  EXPECT_EQ(r.leftover_processes, 0);
  EXPECT_TRUE(r.leftover_shm.empty());
}

// keel-launch's run directory on a disk that fills while the job runs: the event log and the
// workers' logs stop growing, the job does not (it says so once), and the report elsewhere
// has every step.
TEST_F(FullDisk, ARunDirectoryThatFillsCostsItsLogsNotTheJob) {
  if (!mount_tmpfs("64k")) GTEST_SKIP() << skip_why_;
  {
    std::ofstream fill(mnt_ + "/fill", std::ios::binary);
    const std::string block(4096, 'x');
    for (int i = 0; i < 15; ++i) fill.write(block.data(), std::streamsize(block.size()));
  }
  const std::string cfg = write_config(dir_);
  const JobRun r =
      run_command(dir_, bin_dir() + "/keel-launch --report " + dir_ + "/report.json --run-dir " +
                            mnt_ + "/runs --local 2 --config " + cfg +
                            " --set parallel.dp=2 --set train.steps=60 --set train.eval_every=0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 60) << r.report;
  EXPECT_TRUE(contains(r.output,
                       "events.jsonl: cannot write (No space left on device); the job "
                       "goes on without it"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "terminate called")) << r.output;
  EXPECT_EQ(r.leftover_processes, 0);
}

}  // namespace
}  // namespace keel::test
