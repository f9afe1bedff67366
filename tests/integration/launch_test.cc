// keel-launch end to end, with real processes (issue 7): slots on this box (--local) and
// under mpirun train bit for bit like `keel-worker --nproc`; a crashed rank is restarted in
// place; a slot that cannot reach the controller, a worker that cannot load its plugin and
// Ctrl-C end the job cleanly (machines made of network namespaces: launch_netns_test.cc).
// After every job no process of it and no shared-memory segment of it is left.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "integration/launch_harness.h"
#include "parallel/job_key.h"
#include "proto/events.pb.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

using namespace launch;

void expect_matches_nproc(const std::string& parallel, int world, const std::string& extra) {
  const JobRun& ref = nproc_reference(parallel, world);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::string dir = temp_dir("launch");
  const std::string cfg = job_config(dir, parallel);
  LaunchRun r = run_launch(dir, launch_cmd(dir, cfg, extra));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_bitwise_equal(r.report, ref.report);
  EXPECT_TRUE(json_object_array(r.report, "incidents").empty()) << r.report;
  expect_clean(r);
}

TEST(Launch, LocalTp2Dp2MatchesNproc) {
  expect_matches_nproc(kTp2Dp2, 4, "--local 4");
}

TEST(Launch, LocalPp2Dp2MatchesNproc) {
  expect_matches_nproc(kPp2Dp2, 4, "--local 4");
}

TEST(Launch, TwoWorkersPerSlotMatchNproc) {
  expect_matches_nproc(kTp2Dp2, 4, "--local 2 --workers-per-slot 2");
}

TEST(Launch, MpirunMatchesNproc) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "mpirun is not installed (Open MPI's launcher is needed for this test)";
  const JobRun& ref = nproc_reference(kTp2Dp2, 4);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::string dir = temp_dir("mpirun");
  const std::string cfg = job_config(dir, kTp2Dp2);
  LaunchRun r = run_launch(dir,
                           "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun "
                           "-np 4 --oversubscribe --enable-recovery " +
                               launch_cmd(dir, cfg, ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_bitwise_equal(r.report, ref.report);
  expect_clean(r);
}

// A rank of slot 3 is SIGKILLed at step 10: its agent restarts it, the other three keep
// their processes, and the job ends where the fault-free one does.
TEST(Launch, CrashedRankIsRestartedInItsSlot) {
  const JobRun& ref = nproc_reference(kTp2Dp2, 4);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::string dir = temp_dir("launch-crash");
  const std::string cfg = job_config(dir, kTp2Dp2);
  LaunchRun r = run_launch(dir, launch_cmd(dir, cfg, "--local 4 --fault crash@step=10,rank=3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_bitwise_equal(r.report, ref.report);
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "kind"), "crash") << inc[0];
  EXPECT_EQ(json_number_field(inc[0], "rank"), 3) << inc[0];
  EXPECT_EQ(json_number_field(inc[0], "slot"), 3) << inc[0];
  // Not a restart from step 0: rank 3 restored step 10 from its own snapshot, the others
  // kept theirs in memory.
  expect_restored(inc[0], {.step = 10,
                           .from = "memory",
                           .world = 4,
                           .ranks = {{3, "own_snapshot"}},
                           .others = "memory"});
  std::vector<std::string> ranks = json_object_array(r.report, "ranks");
  ASSERT_EQ(ranks.size(), 4u) << r.report;
  for (int k = 0; k < 4; ++k)
    EXPECT_EQ(json_array_field(ranks[size_t(k)], "pids").size(), k == 3 ? 2u : 1u)
        << "rank " << k << ": " << ranks[size_t(k)];
  expect_clean(r);
}

// A reset link is not a death (launcher/controller/agent_host_liveness.cc): every connection to
// the controller, the agents' among them, destroyed from outside three times (`ss -K`, as a
// flapping NIC or a middlebox's reset would), while the job trains. The agents reconnect and
// heartbeat at once, within the controller's grace: no slot lost, no incident, every step.
TEST(Launch, ResetLinksToLiveAgentsLoseNoSlot) {
  const std::string dir = temp_dir("launch-reset");
  const std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 1 dp: 2"}});
  const int steps = 150;
  const std::string job = "--config " + cfg +
                          " --local 4 --set train.steps=" + std::to_string(steps) +
                          " --set train.eval_every=0 --set detect.slow_round_steps=0 "
                          "--fault slow@step=0,rank=0,delay_ms=20";  // paced: resets land in it
  int resets = 0;
  std::set<int> agents_reset;  // PIDs
  JobRun r = run_launch_job(dir, job, [&](pid_t) {
    const std::string job_dir = launched_job_dir(dir);
    if (resets >= 3 || job_dir.empty() || launched_job_step(job_dir) < 10 + 30 * resets) return;
    const std::string endpoint = read_text(job_dir + "/controller");
    const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
    const Ran ss = run_in(dir, "ss -tnpK dst 127.0.0.1 dport = :" + std::to_string(port));
    ASSERT_EQ(ss.rc, 0) << ss.err;
    ++resets;
    std::istringstream lines(ss.out);
    for (std::string line; std::getline(lines, line);)
      if (const size_t at = line.find("\"keel-agent\",pid="); at != std::string::npos)
        agents_reset.insert(std::stoi(line.substr(at + 18)));
  });
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(resets, 3);
  EXPECT_EQ(agents_reset.size(), 4u) << "not every agent's connection was reset";
  EXPECT_TRUE(json_object_array(r.report, "incidents").empty()) << r.report;
  EXPECT_EQ(json_array_field(r.report, "losses").size(), size_t(steps));
}

// --- errors ---

TEST(LaunchErrors, SlotThatCannotReachTheControllerSaysSo) {
  const std::string dir = temp_dir("launch-unreachable");
  const std::string cfg = job_config(dir, kTp2Dp2);
  const std::string join = launch_bin() + " --join tcp://127.0.0.1:1 --slot 1 --job x " +
                           "--config " + cfg + " --run-dir " + dir + "/runs";
  // Without the job's secret it is refused before it tries (naming where it looked).
  LaunchRun no_key = run_launch(dir, join, {}, 60);
  EXPECT_EQ(no_key.exit_code, 2) << no_key.output;
  EXPECT_TRUE(contains(no_key.output, "--join needs the job's secret")) << no_key.output;
  EXPECT_TRUE(contains(no_key.output, dir + "/runs/x/secret does not exist")) << no_key.output;
  JobKey::generate().save(dir + "/secret");
  LaunchRun r = run_launch(dir, join + " --secret-file " + dir + "/secret", {}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot reach the controller at tcp://127.0.0.1:1")) << r.output;
  // It gave up by itself (the register timeout), not killed at run_launch's deadline.
  EXPECT_NE(r.exit_code, 128 + SIGKILL) << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

TEST(LaunchErrors, WorkerThatCannotLoadItsPluginStopsTheJob) {
  const std::string dir = temp_dir("launch-plugin");
  const std::string cfg = job_config(dir, kTp2Dp2);
  LaunchRun r =
      run_launch(dir, launch_cmd(dir, cfg, "--local 4 --set model.plugin=/nonexistent.so"), {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // The worker's own message, forwarded by its agent.
  EXPECT_TRUE(contains(r.output, "keel-worker: error: plugin /nonexistent.so")) << r.output;
  expect_clean(r);
}

TEST(LaunchErrors, CtrlCStopsEverythingAndLeavesNothing) {
  const std::string dir = temp_dir("launch-sigint");
  const std::string cfg = job_config(dir, kTp2Dp2);
  std::string job_dir;
  bool sent = false;
  Clock::time_point started{};
  LaunchRun r = run_launch(
      dir, launch_cmd(dir, cfg, "--local 4 --set train.steps=100000"),
      [&](pid_t pid) {
        if (sent) return;
        if (job_dir.empty()) job_dir = job_dir_in(dir + "/runs");
        if (started == Clock::time_point{}) {
          if (!job_dir.empty() && contains(slurp(job_dir + "/events.jsonl"), "\"start\""))
            started = Clock::now();
          return;
        }
        // Every rank has completed two steps, so each holds snapshots.
        if (launched_job_step(job_dir) < 2) return;
        kill(pid, SIGINT);
        sent = true;
      },
      90);
  ASSERT_TRUE(sent) << r.output;
  // Stopped by the SIGINT itself: a job that went on would be killed at the deadline (SIGKILL).
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.output;
  expect_clean(r);
}

}  // namespace
}  // namespace keel::test
