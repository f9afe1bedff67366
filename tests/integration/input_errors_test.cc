// Bad input refused before the first step (issue 10, items 2 to 5): output paths that cannot
// be written, a config that is a directory, data that does not fit the model, a job too large
// for the machine, a bound exceeded, a checkpoint with a non-finite weight. Each runs the real
// keel-worker and asserts the exit code (2: bad input), the message and that no training
// happened (the report, written after the last step, is absent).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "launcher/worker/rank_backend.h"
#include "model/token_shards.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;

// Exit code 2, `part` in the output, refused before training (no report written).
void expect_refused(const WorkerRun& r, const std::string& part) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(part), std::string::npos) << "expected \"" << part << "\" in:\n"
                                                    << r.output;
  EXPECT_TRUE(r.report.empty()) << "it trained:\n" << r.output;
}

int count_of(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

TEST(InputErrors, OutputIntoMissingDirectoryIsRefusedAtStart) {
  std::string dir = temp_dir("out-missing");
  std::string cfg = write_config(dir);
  for (std::string flag : {"--export-llmc", "--loss-svg"}) {
    WorkerRun r = run_worker(dir, "--config " + cfg + " " + flag + " " + dir + "/none/m.bin");
    expect_refused(r, flag + " " + dir + "/none/m.bin: directory " + dir + "/none does not exist");
  }
  // --report is the harness's own flag; a later one wins.
  WorkerRun r = run_worker(dir, "--config " + cfg + " --report /nonexistent-keel/r.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--report /nonexistent-keel/r.json: directory /nonexistent-keel does "
                          "not exist"),
            std::string::npos)
      << r.output;
}

// Root writes through permission bits, so the test needs a directory that refuses even root:
// /sys is one in most containers and machines; elsewhere the test has nothing to try.
TEST(InputErrors, OutputIntoUnwritableDirectoryIsRefusedAtStart) {
  std::string dir = temp_dir("out-unwritable");
  std::string cfg = write_config(dir);
  std::string probe = "/sys/keel-probe";
  if (std::FILE* f = std::fopen(probe.c_str(), "w")) {
    std::fclose(f);
    std::remove(probe.c_str());
    GTEST_SKIP() << "/sys is writable here";
  }
  WorkerRun r = run_worker(dir, "--config " + cfg + " --loss-svg /sys/loss.svg");
  expect_refused(r, "--loss-svg /sys/loss.svg: cannot write into directory /sys: ");
}

TEST(InputErrors, OutputThatIsADirectoryIsRefusedByName) {
  std::string dir = temp_dir("out-dir");
  std::string cfg = write_config(dir);
  fs::create_directory(dir + "/weights");
  WorkerRun r = run_worker(dir, "--config " + cfg + " --export-llmc " + dir + "/weights");
  expect_refused(r, "--export-llmc " + dir + "/weights: is a directory");
}

TEST(InputErrors, CheckpointDirUnderAFileIsRefused) {
  std::string dir = temp_dir("ckpt-dir");
  std::string cfg = write_config(dir);
  std::ofstream(dir + "/file") << "x";
  WorkerRun r = run_worker(dir, "--config " + cfg +
                                    " --set checkpoint.persistent_every_steps=5"
                                    " --set checkpoint.dir=" +
                                    dir + "/file/ckpt");
  expect_refused(r, "checkpoint.dir = \"" + dir + "/file/ckpt\": " + dir +
                        "/file is not a directory, so it cannot be created");
}

TEST(InputErrors, ConfigThatIsADirectoryIsRefused) {
  std::string dir = temp_dir("config-dir");
  WorkerRun r = run_worker(dir, "--config " + dir);
  expect_refused(r, dir + ": is a directory, expected a config file");
  r = run_worker(dir, "--config " + dir + "/missing.pbtxt");
  expect_refused(r, dir + "/missing.pbtxt: cannot open");
}

TEST(InputErrors, BadTokenDeepInTheDataIsRefusedAtStart) {
  std::string dir = temp_dir("bad-token");
  std::vector<uint16_t> t(30000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = uint16_t(i % 200);
  t[19900] = 300;
  write_token_shard(dir + "/train_000.bin", t);
  std::string cfg = write_config(dir);
  WorkerRun r =
      run_worker(dir, "--config " + cfg + " --set data.train_files=" + dir + "/train_*.bin");
  expect_refused(r, dir + "/train_000.bin: token 300 at position 19900 >= model.vocab_size = 256");
}

TEST(InputErrors, ShortValShardIsRefusedAtStart) {
  std::string dir = temp_dir("short-val");
  write_token_shard(dir + "/val_000.bin", std::vector<uint16_t>(200, 7));  // a batch is 257
  std::string cfg = write_config(dir);
  WorkerRun r = run_worker(dir, "--config " + cfg + " --set data.val_files=" + dir + "/val_*.bin");
  expect_refused(r, dir + "/val_000.bin: 200 tokens, fewer than one batch");
  EXPECT_NE(r.output.find("(data.val_files)"), std::string::npos) << r.output;
}

// A shard cut short while the job trains on it ends the run with the file's name (exit 2), not
// a SIGBUS: shards are read through pread (model/token_shards.h says why).
TEST(InputErrors, ShardTruncatedDuringTrainingEndsTheRunByName) {
  std::string dir = temp_dir("truncated");
  std::string shard = dir + "/train_000.bin";
  fs::copy_file(demo_data_dir() + "/train_000000.bin", shard);
  std::string cfg = write_config(dir);
  std::string out = dir + "/out.txt", rc = dir + "/rc.txt";
  std::string cmd = "timeout 120 " + bin_dir() + "/keel-worker --config " + cfg +
                    " --set train.steps=1000000 --set data.train_files=" + dir + "/train_*.bin > " +
                    out + " 2>&1; echo $? > " + rc;
  std::thread run([&] { std::system(cmd.c_str()); });
  // Truncate once training is under way.
  auto read_all = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (int i = 0; i < 600 && read_all(out).find("step ") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  fs::resize_file(shard, 2048);
  run.join();
  std::string output = read_all(out);
  EXPECT_EQ(read_all(rc), "2\n") << output;
  EXPECT_NE(output.find("step "), std::string::npos) << output;
  EXPECT_NE(output.find(shard + ": truncated while in use: file size is now 2048 bytes"),
            std::string::npos)
      << output;
}

TEST(InputErrors, DirectoryMatchedByDataGlobIsRefusedByName) {
  std::string dir = temp_dir("glob-dir");
  fs::copy_file(demo_data_dir() + "/train_000000.bin", dir + "/train_000.bin");
  fs::create_directory(dir + "/train_old");
  std::string cfg = write_config(dir);
  WorkerRun r = run_worker(dir, "--config " + cfg + " --set data.train_files=" + dir + "/train_*");
  expect_refused(r, dir + "/train_old: is a directory, matched by data.train_files");
}

TEST(InputErrors, JobTooLargeForTheMachineIsRefusedWithTheEstimate) {
  std::string dir = temp_dir("too-large");
  std::string cfg = write_config(dir);
  WorkerRun r = run_worker(dir, "--config " + cfg + " --set model.num_layers=100000");
  expect_refused(r, "the job does not fit in memory");
  EXPECT_NE(r.output.find(" available ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.num_layers = 100000"), std::string::npos) << r.output;
}

TEST(InputErrors, ThreadsAreBounded) {
  std::string dir = temp_dir("threads");
  std::string cfg = write_config(dir);
  WorkerRun r = run_worker(dir, "--config " + cfg + " --set runtime.threads=100000");
  expect_refused(r, "runtime.threads = 100000: must be at most 1024");
}

// Within the config's bound but far beyond this machine: OpenMP threads many to a core
// stalled the worker instead of starting it (runtime.threads=1000 on 2 cores).
TEST(InputErrors, ThreadsFarBeyondTheMachinesCoresAreRefused) {
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = kMaxThreadsPerCore * cores + 1;
  if (threads > 1024) GTEST_SKIP() << "skipped: " << cores << " cores allow any valid count";
  std::string dir = temp_dir("threads-machine");
  std::string cfg = write_config(dir);
  WorkerRun r =
      run_worker(dir, "--config " + cfg + " --set runtime.threads=" + std::to_string(threads));
  expect_refused(r, "runtime.threads = " + std::to_string(threads) + ": this machine has " +
                        std::to_string(cores) + " core(s)");
}

// A lone keel-worker has no supervisor to find a stopped rank: a hang or a freeze would stall
// it for good, so they are refused before anything starts.
TEST(InputErrors, AHangWithoutASupervisorIsRefused) {
  std::string dir = temp_dir("lone-hang");
  std::string cfg = write_config(dir);
  for (const char* kind : {"hang", "freeze"}) {
    WorkerRun r = run_worker(dir, "--config " + cfg + " --fault " + kind + "@step=2,rank=0");
    expect_refused(r, std::string(kind) + " faults need a supervisor");
  }
}

TEST(InputErrors, NprocIsCheckedOnceInTheParent) {
  std::string dir = temp_dir("nproc");
  std::string cfg = write_config(dir);
  WorkerRun r = run_worker(dir, "--config " + cfg + " --nproc 1000");
  expect_refused(r, "parallel.tp·pp·dp = 1·1·1 = 1 but --nproc 1000");
  // Once, by the parent: no rank was started to repeat it.
  EXPECT_EQ(count_of(r.output, "--nproc 1000"), 1) << r.output;
  r = run_worker(dir, "--config " + cfg + " --nproc 5000");
  expect_refused(r, "--nproc 5000: at most 4096 local ranks");
  // A config error, too, is reported once.
  r = run_worker(dir, "--config " + cfg + " --nproc 2 --set parallel.dp=2 --set model.num_layer=3");
  expect_refused(r, "num_layer");
  EXPECT_EQ(count_of(r.output, "error:"), 1) << r.output;
}

TEST(InputErrors, CheckpointWithNonFiniteWeightIsRefused) {
  std::string dir = temp_dir("nan-ckpt");
  std::string cfg = write_config(dir);
  std::string ckpt = dir + "/m.bin";
  WorkerRun made =
      run_worker(dir, "--config " + cfg + " --set train.steps=1 --export-llmc " + ckpt);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  {
    // wte comes first, after the 1024-byte header.
    std::fstream f(ckpt, std::ios::in | std::ios::out | std::ios::binary);
    float nan = std::nanf("");
    f.seekp(1024 + 4 * 5);
    f.write(reinterpret_cast<const char*>(&nan), 4);
  }
  WorkerRun r = run_worker(dir, "--config " + cfg + " --set model.init_checkpoint=" + ckpt);
  expect_refused(r, ckpt + ": tensor wte element 5 = ");
}

}  // namespace
}  // namespace keel::test
