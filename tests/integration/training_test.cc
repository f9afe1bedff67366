// End to end through keel-worker as real processes: learning, determinism, and agreement of
// every parallel layout with the single-rank run of the same global batch.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

double rel(double a, double b) {
  return std::abs(a - b) / std::max(1e-12, std::abs(b));
}

void expect_losses_close(const std::vector<double>& got, const std::vector<double>& want,
                         double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(rel(got[i], want[i]), tol)
        << what << " step " << i << ": " << got[i] << " vs " << want[i];
}

void expect_params_close(const std::string& a, const std::string& b, double tol,
                         const std::string& what) {
  std::vector<float> x = read_llmc_floats(a), y = read_llmc_floats(b);
  ASSERT_EQ(x.size(), y.size()) << what;
  ASSERT_GT(x.size(), 0u);
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double d = std::abs(double(x[i]) - y[i]) / std::max(1.0, std::abs(double(y[i])));
    if (d > worst) worst = d, at = i;
  }
  EXPECT_LE(worst, tol) << what << ": parameter float " << at << " differs: " << x[at] << " vs "
                        << y[at];
}

TEST(Training, SingleRankLearnsTheCorpus) {
  std::string dir = temp_dir("learn");
  std::string cfg = write_config(dir);
  WorkerRun r = run_worker(dir, "--config " + cfg +
                                    " --set train.steps=400 --set train.global_batch_size=16"
                                    " --set model.hidden_size=64 --set model.seq_len=64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<double> losses = json_array_field(r.report, "losses");
  ASSERT_EQ(losses.size(), 400u);
  EXPECT_NEAR(losses[0], std::log(256.0), 0.3);  // uniform over the byte vocabulary at init
  double tail = 0;
  for (size_t i = 390; i < 400; ++i) tail += losses[i] / 10;
  // English bytes have a unigram entropy of about 2.9 nats; getting well under it means the
  // model learned context, not just letter frequencies.
  EXPECT_LT(tail, 2.75) << r.output;
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 400);
  EXPECT_GT(json_number_field(r.report, "tokens_per_s"), 0);
  EXPECT_GT(json_number_field(r.report, "mfu"), 0);
  EXPECT_GT(json_number_field(r.report, "mfu_peak_flops"), 0);
  EXPECT_FALSE(json_string_field(r.report, "mfu_peak_source").empty());
}

TEST(Training, SameSeedSameChecksumOtherSeedOther) {
  std::string dir = temp_dir("seed");
  std::string cfg = write_config(dir);
  WorkerRun a = run_worker(dir, "--config " + cfg);
  WorkerRun b = run_worker(dir, "--config " + cfg);
  WorkerRun c = run_worker(dir, "--config " + cfg + " --set train.seed=99");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  ASSERT_EQ(c.exit_code, 0) << c.output;
  std::string ca = json_string_field(a.report, "param_checksum");
  EXPECT_EQ(ca.size(), 16u);
  EXPECT_EQ(ca, json_string_field(b.report, "param_checksum"));
  EXPECT_EQ(json_array_field(a.report, "losses"), json_array_field(b.report, "losses"));
  EXPECT_NE(ca, json_string_field(c.report, "param_checksum"));
}

struct Layout {
  int tp, pp, dp;
};

// GoogleTest shows a layout as "tp2 pp1 dp1", not its raw bytes: stable CTest names.
void PrintTo(const Layout& l, std::ostream* os) {
  *os << "tp" << l.tp << " pp" << l.pp << " dp" << l.dp;
}

class LayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(LayoutTest, MatchesSingleRankAndIsBitwiseRepeatable) {
  const Layout l = GetParam();
  const int world = l.tp * l.pp * l.dp;
  std::string dir = temp_dir("layout");
  std::string cfg = write_config(dir);
  WorkerRun ref = run_worker(dir, "--config " + cfg + " --export-llmc " + dir + "/ref.bin");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  std::string par = "--config " + cfg + " --nproc " + std::to_string(world) +
                    " --set parallel.tp=" + std::to_string(l.tp) +
                    " --set parallel.pp=" + std::to_string(l.pp) +
                    " --set parallel.dp=" + std::to_string(l.dp);
  WorkerRun a = run_worker(dir, par + " --export-llmc " + dir + "/a.bin");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  WorkerRun b = run_worker(dir, par);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::string name =
      "tp" + std::to_string(l.tp) + " pp" + std::to_string(l.pp) + " dp" + std::to_string(l.dp);
  EXPECT_EQ(json_string_field(a.report, "layout"), name);
  expect_losses_close(json_array_field(a.report, "losses"), json_array_field(ref.report, "losses"),
                      1e-5, name);
  expect_params_close(dir + "/a.bin", dir + "/ref.bin", 1e-5, name);
  // Evaluation runs forward only through the same pipeline and agrees too.
  ASSERT_EQ(json_array_field(ref.report, "val_losses").size(), 2u);
  expect_losses_close(json_array_field(a.report, "val_losses"),
                      json_array_field(ref.report, "val_losses"), 1e-5, name + " validation");
  EXPECT_EQ(json_string_field(a.report, "param_checksum"),
            json_string_field(b.report, "param_checksum"))
      << name << " is not bitwise repeatable";
  // Each communicator that the layout uses moved bytes.
  auto bytes = [&](const char* k) {
    return json_number_field(a.report, std::string("bytes_") + k);
  };
  if (l.tp > 1) {
    EXPECT_GT(bytes("tp"), 0) << name;
  }
  if (l.pp > 1) {
    EXPECT_GT(bytes("pp"), 0) << name;
  }
  if (l.dp > 1) {
    EXPECT_GT(bytes("dp"), 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutTest,
                         ::testing::Values(Layout{2, 1, 1}, Layout{1, 2, 1}, Layout{1, 1, 2},
                                           Layout{2, 2, 1}, Layout{2, 2, 2}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tp) + "pp" +
                                  std::to_string(info.param.pp) + "dp" +
                                  std::to_string(info.param.dp);
                         });

TEST(Training, ZeroOneMatchesPlainDataParallel) {
  std::string dir = temp_dir("zero");
  std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  WorkerRun plain = run_worker(dir, "--config " + cfg + " --nproc 2");
  WorkerRun zero = run_worker(dir, "--config " + cfg + " --nproc 2 --set parallel.zero1=true");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  expect_losses_close(json_array_field(zero.report, "losses"),
                      json_array_field(plain.report, "losses"), 1e-6, "zero1");
}

TEST(Training, OneFOneBMicroBatchesEqualOneBatch) {
  // M = 4 micro-batches of 1 sequence through two stages vs one batch of 4 on one rank.
  std::string dir = temp_dir("1f1b");
  std::string cfg = write_config(dir);
  const std::string batch = " --set train.global_batch_size=4";
  WorkerRun one = run_worker(dir, "--config " + cfg + batch + " --set train.micro_batch_size=4 " +
                                      "--export-llmc " + dir + "/one.bin");
  WorkerRun pipe =
      run_worker(dir, "--config " + cfg + batch + " --set train.micro_batch_size=1 " +
                          "--nproc 2 --set parallel.pp=2 --export-llmc " + dir + "/pipe.bin");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(pipe.exit_code, 0) << pipe.output;
  expect_losses_close(json_array_field(pipe.report, "losses"),
                      json_array_field(one.report, "losses"), 1e-5, "1F1B");
  expect_params_close(dir + "/pipe.bin", dir + "/one.bin", 1e-5, "1F1B");
}

TEST(Training, ShuffledOrderIsDeterministicAndDiffers) {
  std::string dir = temp_dir("shuf");
  std::string cfg = write_config(dir) + " --set data.order=shuffled";
  WorkerRun a = run_worker(dir, "--config " + cfg);
  WorkerRun b = run_worker(dir, "--config " + cfg);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(json_string_field(a.report, "param_checksum"),
            json_string_field(b.report, "param_checksum"));
  WorkerRun seq = run_worker(dir, "--config " + cfg + " --set data.order=sequential");
  EXPECT_NE(json_array_field(a.report, "losses"), json_array_field(seq.report, "losses"));
}

}  // namespace
}  // namespace keel::test

namespace keel::test {
namespace {

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Training, LlmcCheckpointRoundTripsThroughTensorParallelRanks) {
  std::string dir = temp_dir("llmc");
  std::string cfg = write_config(dir);
  WorkerRun a =
      run_worker(dir, "--config " + cfg + " --set train.steps=3 --export-llmc " + dir + "/a.bin");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // Loaded into two TP ranks (sharded on load, gathered on export) and written back
  // untrained: the same bytes.
  WorkerRun b = run_worker(dir, "--config " + cfg + " --nproc 2 --set parallel.tp=2 " +
                                    "--set train.steps=0 --set model.init_checkpoint=" + dir +
                                    "/a.bin --export-llmc " + dir + "/b.bin");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(file_bytes(dir + "/a.bin"), file_bytes(dir + "/b.bin"));
  // A job started from the trained weights begins where training left off, not at init.
  WorkerRun c = run_worker(dir, "--config " + cfg + " --set train.steps=1 " +
                                    "--set model.init_checkpoint=" + dir + "/a.bin");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_LT(json_array_field(c.report, "losses")[0], json_array_field(a.report, "losses")[0]);
  // A checkpoint of another shape is refused, naming the file and field.
  WorkerRun d = run_worker(dir, "--config " + cfg + " --set model.hidden_size=64 " +
                                    "--set model.init_checkpoint=" + dir + "/a.bin");
  EXPECT_EQ(d.exit_code, 2) << d.output;
  EXPECT_NE(d.output.find("a.bin"), std::string::npos) << d.output;
  EXPECT_NE(d.output.find("hidden_size"), std::string::npos) << d.output;
}

}  // namespace
}  // namespace keel::test
