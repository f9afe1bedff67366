// Input that used to be accepted and then ignored or misread (issue 18, items 3, 4, 5, 8, 9,
// 10), run through the real keel-worker and keel-launch: each is refused before training
// (exit 2, a message naming the input, no report, no run directory), or, for the ends of a
// single-process run, leaves no process and no shared memory behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;

// Refused before anything started: exit 2, `part` in the output, no report, no process and
// no shared memory left, and (keel-launch) no run directory made.
void expect_refused(const JobRun& r, const std::string& dir, const std::string& part) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, part)) << "expected \"" << part << "\" in:\n" << r.output;
  EXPECT_TRUE(r.report.empty()) << "it trained:\n" << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
  EXPECT_TRUE(!fs::exists(dir + "/runs") || fs::is_empty(dir + "/runs")) << r.output;
}

JobRun worker(const std::string& dir, const std::string& args) {
  return run_job(dir, "--config " + write_config(dir) + " " + args, {}, 120);
}

JobRun launch(const std::string& dir, const std::string& args) {
  return run_launch_job(dir, "--local 1 --config " + write_config(dir) + " " + args, {}, 120);
}

// The job's own segments in /dev/shm (named after its PID, the session leader's).
bool has_segment(pid_t pid) {
  const std::string mine = "keel-" + std::to_string(pid) + "-";
  for (const auto& e : fs::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(mine, 0) == 0) return true;
  return false;
}

// --- item 3: time fields bounded to what can work ---

TEST(InputRefusals, TimeoutTooShortToWorkIsRefusedWithTheReason) {
  const std::string dir = temp_dir("refuse-timeout");
  for (const bool use_launch : {false, true}) {
    JobRun r = (use_launch ? launch : worker)(dir, "--set detect.slot_timeout_ms=0");
    expect_refused(r, dir,
                   "detect.slot_timeout_ms = 0: must be >= 1000 (agents send a heartbeat every "
                   "200 ms: a few late ones must not lose a healthy slot)");
    r = (use_launch ? launch : worker)(dir, "--set detect.hang_grace_ms=-5");
    expect_refused(r, dir, "detect.hang_grace_ms = -5: must be 0 (off) or >= 600");
  }
}

// --- item 4: --inject of something that holds no faults ---

TEST(InputRefusals, InjectDirectoryIsRefusedByName) {
  const std::string dir = temp_dir("refuse-inject-dir");
  fs::create_directories(dir + "/faults");
  const std::string want =
      dir + "/faults: is a directory, expected a fault schedule file (text protobuf";
  expect_refused(worker(dir, "--inject " + dir + "/faults"), dir, want);
  expect_refused(launch(dir, "--inject " + dir + "/faults"), dir, want);
}

TEST(InputRefusals, EmptyOrMissingScheduleIsRefused) {
  const std::string dir = temp_dir("refuse-inject-empty");
  std::ofstream(dir + "/empty.pbtxt") << "# no faults yet\n";
  expect_refused(worker(dir, "--inject " + dir + "/empty.pbtxt"), dir,
                 dir + "/empty.pbtxt: holds no fault");
  expect_refused(launch(dir, "--inject " + dir + "/empty.pbtxt"), dir,
                 dir + "/empty.pbtxt: holds no fault");
  expect_refused(worker(dir, "--inject " + dir + "/missing.pbtxt"), dir,
                 dir + "/missing.pbtxt: cannot open: No such file or directory");
}

// --- item 5: a single-process run leaves no shared memory ---

// SIGINT (Ctrl-C) and SIGTERM once the rank's snapshot segment exists: the signal still ends
// the process (the status says which), and the segment goes with it.
TEST(InputRefusals, SingleProcessRunRemovesItsSegmentWhenSignalled) {
  const std::string dir = temp_dir("lone-signal");
  for (const int sig : {SIGINT, SIGTERM}) {
    bool sent = false, seen = false;
    JobRun r = run_job(
        dir, "--config " + write_config(dir) + " --set train.steps=1000000",
        [&](pid_t pid) {
          if (sent || !has_segment(pid)) return;
          seen = true;
          kill(pid, sig);
          sent = true;
        },
        120);
    ASSERT_TRUE(seen) << "the run never made its segment:\n" << r.output;
    EXPECT_EQ(r.exit_code, 128 + sig) << r.output;
    EXPECT_TRUE(r.leftover_shm.empty()) << r.leftover_shm.front();
    EXPECT_EQ(r.leftover_processes, 0) << r.output;
  }
}

// An exit fault _exits, skipping every destructor: its segment goes anyway, and the last line
// says that an injected fault ended the run, even with no message of its own.
TEST(InputRefusals, ExitFaultOfSingleProcessRunSaysSoAndLeavesNoSegment) {
  const std::string dir = temp_dir("lone-exit");
  JobRun r = worker(dir, "--fault exit@step=3,rank=0,code=7");
  EXPECT_EQ(r.exit_code, 7) << r.output;
  // The log line's prefix (program, time, source line) ends in "] ".
  EXPECT_TRUE(contains(r.output, "] rank 0: injected exit fault at step 3 (code 7)\n")) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.leftover_shm.front();
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.report.empty()) << r.output;

  r = worker(dir, "--fault 'exit@step=2,rank=0,message=CUDA error: an illegal memory access'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "] rank 0: injected exit fault at step 2 (code 1): CUDA error: "
                       "an illegal memory access\n"))
      << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.leftover_shm.front();
}

// A single-process run killed by SIGKILL cannot clean up: the next one removes what a dead
// PID left, as a supervisor does.
TEST(InputRefusals, SingleProcessRunRemovesSegmentsOfDeadProcesses) {
  const std::string dir = temp_dir("lone-stale");
  // A PID that names no process any more: a child that exited and was reaped.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  ASSERT_NE(kill(child, 0), 0);
  const std::string job = std::to_string(child) + "-0badf00d";
  const std::string name = "/keel-" + job + "-r0";
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_TRUE(fs::exists("/dev/shm" + name));

  JobRun r = worker(dir, "--set train.steps=1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists("/dev/shm" + name)) << r.output;
  shm_unlink(name.c_str());
  EXPECT_TRUE(contains(r.output, "removed 1 shared-memory segment(s) of ended job " + job))
      << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.leftover_shm.front();
}

// --- item 8: settings the recovery mode would ignore ---

TEST(InputRefusals, RecoverySettingsTheModeIgnoresAreRefused) {
  const std::string dir = temp_dir("refuse-recovery-combo");
  JobRun r = launch(dir, "--set recovery.mode=restart_all --set detect.on_slot_loss=wait");
  expect_refused(r, dir,
                 "detect.on_slot_loss = wait: needs recovery.mode = in_place, not restart_all");
  r = worker(dir, "--set recovery.mode=in_place --set recovery.evict=dp_replica");
  expect_refused(r, dir,
                 "recovery.evict = dp_replica: needs recovery.mode = hot_swap, not in_place "
                 "(in_place never evicts a slot)");
}

// --- item 10: the same fault twice ---

TEST(InputRefusals, DuplicateFaultIsRefusedNamingBoth) {
  const std::string dir = temp_dir("refuse-dup-fault");
  const std::string want =
      "--fault 'crash@step=3,rank=0': the same fault as --fault 'crash@step=3,rank=0' (given "
      "twice, it would fire twice; give it once)";
  expect_refused(worker(dir, "--fault crash@step=3,rank=0 --fault crash@step=3,rank=0"), dir, want);
  expect_refused(launch(dir, "--fault crash@step=3,rank=0 --fault crash@step=3,rank=0"), dir, want);
  // Once on the command line and once in a file.
  std::ofstream(dir + "/f.pbtxt") << "fault {\n  kind: crash\n  step: 3\n  rank: 0\n}\n";
  expect_refused(worker(dir, "--fault crash@step=3,rank=0 --inject " + dir + "/f.pbtxt"), dir,
                 dir + "/f.pbtxt:1: fault[0]: the same fault as --fault 'crash@step=3,rank=0'");
}

}  // namespace
}  // namespace keel::test
