// The Llama example plugin (examples/plugins/llama/) trained end to end through keel-worker
// as real processes: every parallel layout (TP, PP, DP, and all three) agrees with the
// single-rank run, and a layout run twice gives the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

// The test GPT's config (worker_harness.cc) with the Llama plugin swapped in.
std::string llama_args(const std::string& cfg) {
  return "--config " + cfg + " --set model.plugin=" + bin_dir() +
         "/libkeel_llama.so --set model.ffn_hidden_size=96";
}

struct Layout {
  int tp, pp, dp;
};

// GoogleTest shows a layout as "tp2 pp1 dp1", not its raw bytes: stable CTest names.
void PrintTo(const Layout& l, std::ostream* os) {
  *os << "tp" << l.tp << " pp" << l.pp << " dp" << l.dp;
}

class LlamaLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(LlamaLayoutTest, MatchesSingleRankAndIsBitwiseRepeatable) {
  const Layout l = GetParam();
  const int world = l.tp * l.pp * l.dp;
  const std::string dir = temp_dir("llama_layout");
  const std::string args = llama_args(write_config(dir));
  WorkerRun ref = run_worker(dir, args);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  EXPECT_EQ(json_string_field(ref.report, "plugin"), "llama");
  const std::vector<double> want = json_array_field(ref.report, "losses");
  ASSERT_EQ(want.size(), 10u);
  EXPECT_NEAR(want[0], std::log(256.0), 0.3);
  EXPECT_LT(want.back(), want.front());
  const std::string par =
      args + " --nproc " + std::to_string(world) + " --set parallel.tp=" + std::to_string(l.tp) +
      " --set parallel.pp=" + std::to_string(l.pp) + " --set parallel.dp=" + std::to_string(l.dp);
  WorkerRun a = run_worker(dir, par);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  WorkerRun b = run_worker(dir, par);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::string name =
      "tp" + std::to_string(l.tp) + " pp" + std::to_string(l.pp) + " dp" + std::to_string(l.dp);
  EXPECT_EQ(json_string_field(a.report, "layout"), name);
  const std::vector<double> got = json_array_field(a.report, "losses");
  ASSERT_EQ(got.size(), want.size()) << name;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << name << " step " << i;
  const std::vector<double> val = json_array_field(a.report, "val_losses");
  const std::vector<double> want_val = json_array_field(ref.report, "val_losses");
  ASSERT_EQ(val.size(), want_val.size()) << name;
  for (size_t i = 0; i < val.size(); ++i)
    EXPECT_NEAR(val[i], want_val[i], 1e-5 * std::abs(want_val[i])) << name << " eval " << i;
  EXPECT_EQ(json_string_field(a.report, "param_checksum"),
            json_string_field(b.report, "param_checksum"))
      << name << " is not bitwise repeatable";
}

INSTANTIATE_TEST_SUITE_P(Layouts, LlamaLayoutTest,
                         ::testing::Values(Layout{2, 1, 1}, Layout{1, 2, 1}, Layout{1, 1, 2},
                                           Layout{2, 2, 2}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tp) + "pp" +
                                  std::to_string(info.param.pp) + "dp" +
                                  std::to_string(info.param.dp);
                         });

}  // namespace
}  // namespace keel::test
