// --resume of a checkpoint written by another model (issue 18): refused naming the field that
// differs and both values, as a different parallel layout is, not with two fingerprints.
#include <gtest/gtest.h>

#include <string>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

TEST(ResumeModel, AnotherHiddenSizeIsNamedWithBothValues) {
  const std::string dir = temp_dir("resume-model");
  const std::string ck = dir + "/ck";
  const std::string cfg = write_config(dir);  // hidden_size 32
  const std::string args = "--config " + cfg +
                           " --set train.eval_every=0 --set checkpoint.persistent_every_steps=2 "
                           "--set checkpoint.dir=" +
                           ck;
  const JobRun first = run_job(dir, args + " --set train.steps=2");
  ASSERT_EQ(first.exit_code, 0) << first.output;

  const JobRun other =
      run_job(dir, args + " --set train.steps=4 --set model.hidden_size=64 --resume " + ck);
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_TRUE(contains(other.output, "model.hidden_size = 32 in the checkpoint, 64 in this job"))
      << other.output;
  // Derived from the hidden size: the resolved value is compared, and named too.
  EXPECT_TRUE(
      contains(other.output, "model.ffn_hidden_size = 128 in the checkpoint, 256 in this job"))
      << other.output;
  EXPECT_FALSE(contains(other.output, "layout_fingerprint")) << other.output;
  EXPECT_FALSE(contains(other.output, "model.num_layers")) << other.output;
  EXPECT_EQ(other.leftover_processes, 0);
  EXPECT_TRUE(other.leftover_shm.empty());

  // Two ranks (the supervisor's path) say the same.
  const JobRun two = run_job(dir, args +
                                      " --nproc 2 --set parallel.dp=1 --set parallel.pp=2 "
                                      "--set train.steps=4 --set model.num_layers=4 --resume " +
                                      ck);
  EXPECT_EQ(two.exit_code, 2) << two.output;
  // Another layout is resharded, not refused (tests/integration/reshard_test.cc): only the
  // model is named.
  EXPECT_FALSE(contains(two.output, "pp = 1")) << two.output;
  EXPECT_TRUE(contains(two.output, "model.num_layers = 2 in the checkpoint, 4 in this job"))
      << two.output;
  EXPECT_EQ(two.leftover_processes, 0);
  EXPECT_TRUE(two.leftover_shm.empty());

  // The same model resumes.
  const JobRun same = run_job(dir, args + " --set train.steps=4 --resume " + ck);
  ASSERT_EQ(same.exit_code, 0) << same.output;
  // From the first run's checkpoint of step 2, not from step 0.
  expect_resumed(same.report, 2, 4);
}

}  // namespace
}  // namespace keel::test
