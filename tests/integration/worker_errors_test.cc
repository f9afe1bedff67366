// keel-worker facing bad input and a dead peer: clear errors with the right exit codes,
// never a hang.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "parallel/job_key.h"
#include "parallel/tcp_store.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

TEST(WorkerErrors, ConfigTypoNamesFileLineAndField) {
  std::string dir = temp_dir("typo");
  std::string cfg = write_config(dir, {{"model", "num_layer: 3"}});
  WorkerRun r = run_worker(dir, "--config " + cfg);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "job.pbtxt:1")) << r.output;
  EXPECT_TRUE(contains(r.output, "num_layer")) << r.output;
}

TEST(WorkerErrors, ImpossibleLayoutNamesTheFields) {
  std::string dir = temp_dir("layout");
  std::string cfg = write_config(dir);
  WorkerRun r = run_worker(dir, "--config " + cfg + " --set parallel.tp=3 --nproc 3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "parallel.tp")) << r.output;
}

TEST(WorkerErrors, WorldSizeMismatchSaysHowToStart) {
  std::string dir = temp_dir("world");
  std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  WorkerRun r = run_worker(dir, "--config " + cfg);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--nproc 2")) << r.output;
}

TEST(WorkerErrors, MissingShardsNameTheGlobAndField) {
  std::string dir = temp_dir("shards");
  std::string cfg = write_config(dir);
  WorkerRun r =
      run_worker(dir, "--config " + cfg + " --set data.train_files=" + dir + "/nope_*.bin");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "nope_*.bin")) << r.output;
  EXPECT_TRUE(contains(r.output, "data.train_files")) << r.output;
}

TEST(WorkerErrors, MissingPluginIsRefused) {
  std::string dir = temp_dir("plugin");
  std::string cfg = write_config(dir);
  WorkerRun r = run_worker(dir, "--config " + cfg + " --set model.plugin=" + dir + "/libnone.so");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "libnone.so")) << r.output;
}

TEST(WorkerErrors, RankKilledMidTrainingFailsItsPeerWithTypedError) {
  std::string dir = temp_dir("kill");
  std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  TcpStoreServer store("127.0.0.1", 0);
  int out_pipe[2];
  ASSERT_EQ(pipe(out_pipe), 0);
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = fork();
    ASSERT_GE(pids[r], 0);
    if (pids[r] == 0) {
      dup2(out_pipe[1], 1);
      dup2(out_pipe[1], 2);
      close(out_pipe[0]);
      setenv("KEEL_RANK", std::to_string(r).c_str(), 1);
      setenv("KEEL_WORLD_SIZE", "2", 1);
      setenv("KEEL_LOCAL_WORLD_SIZE", "2", 1);
      setenv("KEEL_STORE_ADDR", ("127.0.0.1:" + std::to_string(store.port())).c_str(), 1);
      setenv("KEEL_JOB_SECRET", process_job_key().hex().c_str(), 1);  // the store's key
      std::string bin = bin_dir() + "/keel-worker";
      // A communicator timeout of an hour: only noticing the dead peer can end rank 0 before
      // the test's deadline.
      execl(bin.c_str(), bin.c_str(), "--config", cfg.c_str(), "--set", "train.steps=1000000",
            "--set", "parallel.comm_timeout_ms=3600000", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  close(out_pipe[1]);
  std::string out;
  char buf[4096];
  // Wait until rank 0 reports a few steps, so both ranks are inside the training loop.
  while (!contains(out, "step     3/")) {
    ssize_t n = read(out_pipe[0], buf, sizeof(buf));
    ASSERT_GT(n, 0) << out;
    out.append(buf, size_t(n));
  }
  kill(pids[1], SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  waitpid(pids[1], &status, 0);
  // Rank 0 must notice on its own, with the typed error, long before its timeout.
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  pid_t done = 0;
  while ((done = waitpid(pids[0], &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    ssize_t n = read(out_pipe[0], buf, sizeof(buf));
    if (n > 0) out.append(buf, size_t(n));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (done == 0) {
    kill(pids[0], SIGKILL);
    waitpid(pids[0], &status, 0);
    FAIL() << "rank 0 did not notice its dead peer:\n" << out;
  }
  ssize_t n;
  while ((n = read(out_pipe[0], buf, sizeof(buf))) > 0) out.append(buf, size_t(n));
  close(out_pipe[0]);
  EXPECT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 3) << out;
  EXPECT_TRUE(contains(out, "communication failed")) << out;
}

}  // namespace
}  // namespace keel::test
