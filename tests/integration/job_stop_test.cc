// A job keel stops ends like a job (issue 31): a stop rule, a signal or a refused start
// leaves a report that says why, keel's own exit code and nothing behind; and one checkpoint
// directory has one writer at a time.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

#include "launcher/exit_codes.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;

// recovery.max_incidents = 0: the first failure stops the job. Before, it exited 137 (the
// killed rank's status) with no report and an empty `why`.
TEST(JobStop, AStopRuleEndsTheJobWithItsReportAndKeelsCode) {
  const std::string dir = temp_dir("stop-rule");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  JobRun r = run_launch_job(dir, "--config " + cfg +
                                     " --local 3 --standby 1 --set train.steps=200 "
                                     "--set train.eval_every=0 --set recovery.max_incidents=0 "
                                     "--fault crash@step=12,rank=1");
  EXPECT_EQ(r.exit_code, kExitStopped) << r.output;
  ASSERT_FALSE(r.report.empty()) << r.output;
  EXPECT_TRUE(contains(r.report, "\"stopped\": true")) << r.report;
  EXPECT_TRUE(contains(json_string_field(r.report, "stop_reason"), "recovery.max_incidents = 0"))
      << r.report;
  // The steps done before the crash are the report's, each with its loss.
  const double steps = json_number_field(r.report, "steps_completed");
  EXPECT_GE(steps, 12) << r.report;
  EXPECT_EQ(json_array_field(r.report, "losses").size(), size_t(steps)) << r.report;
  // The event log's stop says why, too.
  const std::string events = read_text(launched_job_dir(dir) + "/events.jsonl");
  EXPECT_TRUE(contains(events, "\"kind\":\"stop\"")) << events;
  EXPECT_TRUE(contains(events, "more than recovery.max_incidents")) << events;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// Job A writes persistent checkpoints into ck/; job B pointed at ck/ while A runs is refused
// at start, told who holds it, and A is untouched. A stopped by SIGTERM writes its report;
// once A is gone the directory is free.
TEST(JobStop, ACheckpointDirectoryHasOneWriter) {
  const std::string dir = temp_dir("ck-owner");
  const std::string ck = dir + "/ck";
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  const std::string args = "--config " + cfg + " --nproc 2 --set train.eval_every=0 " +
                           "--set checkpoint.persistent_every_steps=5 --set checkpoint.dir=" + ck;
  const std::string dir_b = temp_dir("ck-owner-b");
  bool refused_checked = false, sent = false;
  WorkerRun b;
  JobRun a = run_job(
      dir, args + " --set train.steps=100000",
      [&](pid_t pid) {
        if (sent || !fs::exists(ck + "/step_000005/manifest.pb")) return;
        b = run_worker(dir_b, args + " --set train.steps=10");
        refused_checked = true;
        kill(pid, SIGTERM);
        sent = true;
      },
      120);
  ASSERT_TRUE(refused_checked) << a.output;
  EXPECT_EQ(b.exit_code, 2) << b.output;
  EXPECT_TRUE(contains(b.output, "checkpoint.dir " + ck)) << b.output;
  EXPECT_TRUE(contains(b.output, "is writing its checkpoints there")) << b.output;
  EXPECT_TRUE(b.report.empty());
  // A went on until the signal, and ends with its report.
  EXPECT_EQ(a.exit_code, 128 + SIGTERM) << a.output;
  EXPECT_TRUE(contains(a.report, "\"stopped\": true")) << a.output;
  EXPECT_TRUE(contains(json_string_field(a.report, "stop_reason"), "stopped from outside"))
      << a.report;
  EXPECT_GE(json_number_field(a.report, "steps_completed"), 5) << a.report;
  EXPECT_EQ(a.leftover_processes, 0) << a.output;
  EXPECT_TRUE(a.leftover_shm.empty()) << a.output;
  // The lock went with A's process: the directory is free for the next job.
  const int fd = open((ck + "/.keel-owner").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_NE(fd, -1);
  EXPECT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0) << "the owner lock outlived its job";
  close(fd);
}

}  // namespace
}  // namespace keel::test
