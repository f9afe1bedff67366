// The Llama example plugin (examples/plugins/llama/, libkeel_llama.so) through the same harness
// as the GPT's: gradients against finite differences, every TP/PP split against the unsplit
// model (one micro-batch, then a few training steps), bitwise repeatability, and what it
// describes and refuses. Also writes the dump tests/llama_reference.py checks against PyTorch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "runtime/check.h"
#include "runtime/rng.h"
#include "tests/model/gpt_test_harness.h"
#include "tests/model/plugin_test_checks.h"
#include "tests/test_paths.h"

namespace keel::test {
namespace {

// L=2, C=16, NH=4 (head size 4), F=48, T=8, V=64 padded to 72 so that padding rows exist at
// every tp.
keel_model_dims tiny_dims(float init_std) {
  return {2, 16, 4, 48, 8, 64, 72, init_std};
}
constexpr int kB = 2, kT = 8;
constexpr float kLossScale = 1.0f / (kB * kT);
constexpr const char* kLib = "libkeel_llama.so";

class LlamaPluginTest : public ::testing::Test {
 protected:
  GptHarness llama{tiny_dims(0.1f), kB, kT, kLib};
  std::vector<int32_t> tokens = llama.tokens(1), targets = llama.tokens(2);
  Tensors params = llama.init(7, /*perturb=*/true);

  GptRun run(int tp, int pp, bool backward = true, const Tensors* p = nullptr) {
    return llama.run(p ? *p : params, tokens, targets, tp, pp, backward, kLossScale);
  }

  // `steps` plain SGD steps on the same batch; the loss before each.
  std::vector<double> train(int tp, int pp, int steps, Tensors* final_params) {
    Tensors p = params;
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      GptRun r = run(tp, pp, true, &p);
      expect_no_problems(r);
      losses.push_back(r.loss_sum * kLossScale);
      for (auto& [name, v] : p) {
        const std::vector<float>& g = r.grads.at(name);
        for (size_t i = 0; i < v.size(); ++i) v[i] -= 0.5f * g[i];
      }
    }
    if (final_params) *final_params = p;
    return losses;
  }
};

TEST_F(LlamaPluginTest, GradientMatchesFiniteDifferences) {
  GptRun base = run(1, 1);
  expect_no_problems(base);
  auto loss = [&](const Tensors& p) { return run(1, 1, false, &p).loss_sum * kLossScale; };
  const int checked = check_against_finite_differences(llama.descs(), params, base, loss);
  EXPECT_EQ(checked, 4 * (1 + 6 * 2 + 2));
  // Padding rows of the vocabulary are never a target nor an input.
  for (const char* name : {"embed.weight", "lm_head.weight"}) {
    const std::vector<float>& dw = base.grads.at(name);
    for (size_t i = size_t(64) * 16; i < dw.size(); ++i) ASSERT_EQ(dw[i], 0.0f) << name << i;
  }
}

TEST_F(LlamaPluginTest, PipelineSplitMatchesOneStage) {
  expect_split_matches(run(1, 1), run(1, 2), 1e-6);
}

TEST_F(LlamaPluginTest, TensorParallelMatchesOneRank) {
  expect_split_matches(run(1, 1), run(2, 1), 1e-5);
}

TEST_F(LlamaPluginTest, TensorTimesPipelineMatchesOneRank) {
  expect_split_matches(run(1, 1), run(2, 2), 1e-5);
}

TEST_F(LlamaPluginTest, FourWayTensorParallelMatchesOneRank) {
  expect_split_matches(run(1, 1), run(4, 1), 1e-5);
}

TEST_F(LlamaPluginTest, TrainsAlikeOnEveryLayoutAndRepeatsBitwise) {
  Tensors ref_params;
  const std::vector<double> ref = train(1, 1, 5, &ref_params);
  // It learns the batch: five steps lower the loss.
  EXPECT_LT(ref.back(), ref.front() - 0.1) << ref.front() << " -> " << ref.back();
  for (auto [tp, pp] : {std::pair{2, 1}, {1, 2}, {2, 2}}) {
    SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
    Tensors got_params;
    const std::vector<double> got = train(tp, pp, 5, &got_params);
    for (size_t s = 0; s < ref.size(); ++s)
      EXPECT_NEAR(got[s], ref[s], 1e-5 * std::fabs(ref[s])) << "step " << s;
    expect_grads_near(ref_params, got_params, 1e-5);
  }
  // The same layout twice: the same bits.
  Tensors again_a, again_b;
  EXPECT_EQ(train(2, 2, 2, &again_a), train(2, 2, 2, &again_b));
  EXPECT_EQ(again_a, again_b);
}

TEST(LlamaPlugin, LossAtInitIsLogVocab) {
  const int B = 16;
  GptHarness llama(tiny_dims(0.02f), B, kT, kLib);
  GptRun r = llama.run(llama.init(11, false), llama.tokens(5), llama.tokens(6), 1, 1, false, 1.0f);
  expect_no_problems(r);
  EXPECT_NEAR(r.loss_sum / (B * kT), std::log(64.0), 0.04);
}

TEST(LlamaPlugin, DescribesUntiedBiasFreeParameters) {
  GptHarness llama(tiny_dims(0.02f), kB, kT, kLib);
  EXPECT_STREQ(llama.plugin().table().name, "llama");
  EXPECT_EQ(llama.plugin().table().abi_version, KEEL_PLUGIN_ABI_VERSION);
  const auto& d = llama.descs();
  ASSERT_EQ(d.size(), 1u + 6 * 2 + 2);
  EXPECT_STREQ(d[0].name, "embed.weight");
  EXPECT_EQ(d[0].tp_dim, 0);
  const char* layer1[] = {"attn_norm.weight", "attn.qkv.weight",    "attn.proj.weight",
                          "mlp_norm.weight",  "mlp.gate_up.weight", "mlp.down.weight"};
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(std::string(d[7 + i].name), std::string("h.1.") + layer1[i]);
  EXPECT_EQ(d[2].tp_blocks, 3);  // q|k|v
  EXPECT_EQ(d[5].tp_blocks, 2);  // gate|up
  EXPECT_EQ(d[5].shape[0], 2 * 48);
  EXPECT_EQ(d[6].tp_dim, 1);  // down: row-parallel
  EXPECT_EQ(d[1].init, KEEL_INIT_ONES);
  EXPECT_EQ(d[1].flags, 0u);
  EXPECT_STREQ(d[13].name, "norm.weight");
  EXPECT_STREQ(d[14].name, "lm_head.weight");
  for (const auto& p : d)  // matrices decay, the RMSNorm gains do not
    EXPECT_EQ(p.flags, p.ndim >= 2 ? KEEL_PARAM_WEIGHT_DECAY : 0u) << p.name;
  // The last of two stages holds its layer, the final norm and the head, and nothing is tied.
  auto last = llama.plugin().describe(llama.dims(), keel_stage{1, 2, 1, 2, 1, 2});
  ASSERT_EQ(last.size(), 6u + 2);
  EXPECT_STREQ(last[7].name, "lm_head.weight");
  for (const auto& p : last) {
    EXPECT_STREQ(p.tied_to, "") << p.name;
    EXPECT_EQ(p.flags & KEEL_PARAM_TIED_COPY, 0u) << p.name;
  }
  // 6·N + 12·L·C·T, N counting embedding and head separately.
  const double n =
      2.0 * 72 * 16 + 2 * (16 + 3 * 16 * 16 + 16 * 16 + 16 + 2 * 48 * 16 + 16 * 48) + 16;
  const keel_model_dims dims = tiny_dims(0.02f);
  EXPECT_DOUBLE_EQ(llama.plugin().table().flops_per_token(&dims), 6 * n + 12.0 * 2 * 16 * 8);
}

TEST(LlamaPlugin, ValidateNamesFieldAndValue) {
  GptHarness llama(tiny_dims(0.02f), kB, kT, kLib);
  auto refusal = [&](keel_model_dims dims, keel_stage stage) -> std::string {
    try {
      llama.plugin().describe(dims, stage);
    } catch (const InputError& e) {
      return e.what();
    }
    return "accepted";
  };
  const keel_stage one{0, 1, 0, 1, 0, 2};
  auto dims = [](auto edit) {
    keel_model_dims d = tiny_dims(0.02f);
    edit(d);
    return d;
  };
  struct Case {
    keel_model_dims dims;
    keel_stage stage;
    const char* want;
  } cases[] = {
      {dims([](auto& d) { d.hidden_size = 12; }), one, "head size hidden_size / num_heads = 3"},
      {tiny_dims(0.02f), {0, 3, 0, 1, 0, 2}, "num_heads = 4 is not divisible by tp_size = 3"},
      {dims([](auto& d) { d.ffn_hidden_size = 50; }),
       {0, 4, 0, 1, 0, 2},
       "ffn_hidden_size = 50 is not divisible by tp_size = 4"},
      {dims([](auto& d) { d.vocab_size = 80; }), one,
       "padded_vocab_size = 72 is smaller than vocab_size = 80"},
      {tiny_dims(0.02f), {0, 1, 1, 2, 0, 1}, "layer_end = 1 on the last pp_rank 1"},
  };
  for (const Case& c : cases) {
    std::string msg = refusal(c.dims, c.stage);
    EXPECT_NE(msg.find(c.want), std::string::npos) << "want '" << c.want << "', got: " << msg;
    EXPECT_NE(msg.find("llama"), std::string::npos) << msg;
  }
  EXPECT_EQ(refusal(tiny_dims(0.02f), {1, 4, 1, 2, 1, 2}), "accepted");
}

// The plugin is written as one outside keel would be: of keel it includes model/plugin.h only.
TEST(LlamaPlugin, SourcesIncludeOnlyThePublicApi) {
  const std::regex quoted_include("#include \"([^\"]+)\"");
  int files = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(source_dir() + "/examples/plugins/llama")) {
    const std::string ext = e.path().extension();
    if (ext != ".cc" && ext != ".h") continue;
    ++files;
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (std::sregex_iterator it(text.begin(), text.end(), quoted_include), end; it != end; ++it) {
      const std::string inc = (*it)[1];
      EXPECT_TRUE(inc == "model/plugin.h" || inc.rfind("examples/plugins/llama/", 0) == 0)
          << e.path() << " includes " << inc;
    }
  }
  EXPECT_GE(files, 4);
}

// Writes, for tests/llama_reference.py, the tiny model's parameters (as initialised, then
// perturbed), one batch and the loss the plugin computes on it. Runs only when the script
// asks for it through KEEL_LLAMA_DUMP (the file to write).
TEST(LlamaPlugin, DumpForTorchReference) {
  const char* path = std::getenv("KEEL_LLAMA_DUMP");
  if (!path) GTEST_SKIP() << "KEEL_LLAMA_DUMP not set (tests/llama_reference.py sets it)";
  const keel_model_dims dims = tiny_dims(0.1f);
  GptHarness llama(dims, kB, kT, kLib);
  const Tensors params = llama.init(7, /*perturb=*/true);
  const std::vector<int32_t> tokens = llama.tokens(1), targets = llama.tokens(2);
  GptRun r = llama.run(params, tokens, targets, 1, 1, false, 1.0f);
  expect_no_problems(r);
  // One line of JSON (dims, batch, loss, tensor names and shapes in describe order), then the
  // tensors' float32 values back to back.
  std::ostringstream h;
  h.precision(17);
  h << "{\"num_layers\": " << dims.num_layers << ", \"hidden_size\": " << dims.hidden_size
    << ", \"num_heads\": " << dims.num_heads << ", \"ffn_hidden_size\": " << dims.ffn_hidden_size
    << ", \"vocab_size\": " << dims.vocab_size
    << ", \"padded_vocab_size\": " << dims.padded_vocab_size << ", \"rope_theta\": 10000"
    << ", \"rms_eps\": 1e-5, \"B\": " << kB << ", \"T\": " << kT
    << ", \"loss\": " << r.loss_sum / (kB * kT) << ", \"tokens\": [";
  for (size_t i = 0; i < tokens.size(); ++i) h << (i ? ", " : "") << tokens[i];
  h << "], \"targets\": [";
  for (size_t i = 0; i < targets.size(); ++i) h << (i ? ", " : "") << targets[i];
  h << "], \"tensors\": [";
  for (size_t i = 0; i < llama.descs().size(); ++i) {
    const keel_param_desc& d = llama.descs()[i];
    h << (i ? ", " : "") << "{\"name\": \"" << d.name << "\", \"shape\": [";
    for (int k = 0; k < d.ndim; ++k) h << (k ? ", " : "") << d.shape[k];
    h << "]}";
  }
  h << "]}\n";
  std::ofstream out(path, std::ios::binary);
  ASSERT_TRUE(out) << path;
  const std::string header = h.str();
  out.write(header.data(), std::streamsize(header.size()));
  for (const auto& d : llama.descs()) {
    const std::vector<float>& v = params.at(d.name);
    out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  }
  ASSERT_TRUE(out.good());
}

}  // namespace
}  // namespace keel::test
