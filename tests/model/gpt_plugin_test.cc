// The GPT-2 plugin: its gradient against finite differences, pipeline and tensor-parallel
// splits against the unsplit model, the loss at init, and what it describes and refuses.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/check.h"
#include "runtime/rng.h"
#include "tests/model/gpt_test_harness.h"
#include "tests/model/plugin_test_checks.h"
#include "tests/test_paths.h"

namespace keel::test {
namespace {

// L=2, C=16, NH=4, F=64, T=8, V=64 padded to 72 so that padding rows exist at every tp.
keel_model_dims tiny_dims(float init_std) {
  return {2, 16, 4, 64, 8, 64, 72, init_std};
}
constexpr int kB = 2, kT = 8;
constexpr float kLossScale = 1.0f / (kB * kT);

class GptPluginTest : public ::testing::Test {
 protected:
  // Spread init for the gradient check so that activations are not all in the linear regime.
  GptHarness gpt{tiny_dims(0.1f), kB, kT};
  std::vector<int32_t> tokens = gpt.tokens(1), targets = gpt.tokens(2);
  Tensors params = gpt.init(7, /*perturb=*/true);

  GptRun run(int tp, int pp, bool backward = true, const Tensors* p = nullptr) {
    return gpt.run(p ? *p : params, tokens, targets, tp, pp, backward, kLossScale);
  }
};

TEST_F(GptPluginTest, GradientMatchesFiniteDifferences) {
  GptRun base = run(1, 1);
  expect_no_problems(base);
  auto loss = [&](const Tensors& p) { return run(1, 1, false, &p).loss_sum * kLossScale; };
  const int checked = check_against_finite_differences(gpt.descs(), params, base, loss);
  EXPECT_EQ(checked, 4 * (2 + 12 * 2 + 2));
  // Padding rows of the vocabulary are never a target nor an input.
  const std::vector<float>& dwte = base.grads.at("wte");
  for (size_t i = size_t(64) * 16; i < dwte.size(); ++i) ASSERT_EQ(dwte[i], 0.0f) << i;
}

TEST_F(GptPluginTest, PipelineSplitMatchesOneStage) {
  expect_split_matches(run(1, 1), run(1, 2), 1e-6);
}

TEST_F(GptPluginTest, TensorParallelMatchesOneRank) {
  expect_split_matches(run(1, 1), run(2, 1), 1e-5);
}

TEST_F(GptPluginTest, TensorTimesPipelineMatchesOneRank) {
  expect_split_matches(run(1, 1), run(2, 2), 1e-5);
}

TEST_F(GptPluginTest, FourWayTensorParallelMatchesOneRank) {
  // One head per rank, and rank 3's vocab rows [54, 72) are mostly padding.
  expect_split_matches(run(1, 1), run(4, 1), 1e-5);
}

TEST(GptPlugin, LossAtInitIsLogVocab) {
  // Logits of std ~0.02·sqrt(C) = 0.08 add ~0.003 to ln(V) on average; over 128 random
  // targets the mean loss scatters by ~0.01. ln(72) (padding not excluded) is 0.118 away.
  const int B = 16;
  GptHarness gpt(tiny_dims(0.02f), B, kT);
  GptRun r = gpt.run(gpt.init(11, false), gpt.tokens(5), gpt.tokens(6), 1, 1, false, 1.0f);
  expect_no_problems(r);
  EXPECT_NEAR(r.loss_sum / (B * kT), std::log(64.0), 0.04);
}

TEST(GptPlugin, DescribesLlmcParameters) {
  GptHarness gpt(tiny_dims(0.02f), kB, kT);
  const auto& d = gpt.descs();
  ASSERT_EQ(d.size(), 2u + 12 * 2 + 2);
  EXPECT_STREQ(d[0].name, "wte");
  EXPECT_EQ(d[0].shape[0], 72);
  EXPECT_EQ(d[0].tp_dim, 0);
  EXPECT_EQ(d[0].flags, KEEL_PARAM_WEIGHT_DECAY);
  EXPECT_STREQ(d[1].name, "wpe");
  EXPECT_EQ(d[1].tp_dim, -1);
  const char* layer1[] = {"ln1.weight",       "ln1.bias",       "attn.qkv.weight", "attn.qkv.bias",
                          "attn.proj.weight", "attn.proj.bias", "ln2.weight",      "ln2.bias",
                          "mlp.fc.weight",    "mlp.fc.bias",    "mlp.proj.weight", "mlp.proj.bias"};
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(std::string(d[14 + i].name), std::string("h.1.") + layer1[i]);
  const keel_param_desc &qkv = d[4], &proj = d[6], &fc_b = d[11], &mlp_proj = d[12];
  EXPECT_EQ(qkv.tp_dim, 0);
  EXPECT_EQ(qkv.tp_blocks, 3);
  EXPECT_FLOAT_EQ(qkv.init_std, 0.02f);
  EXPECT_EQ(proj.tp_dim, 1);
  EXPECT_FLOAT_EQ(proj.init_std, 0.02f / 2);  // 1/sqrt(2·L)
  EXPECT_EQ(fc_b.tp_dim, 0);
  EXPECT_EQ(fc_b.init, KEEL_INIT_ZEROS);
  EXPECT_EQ(fc_b.flags, 0u);
  EXPECT_EQ(mlp_proj.tp_dim, 1);
  EXPECT_EQ(d[2].init, KEEL_INIT_ONES);
  EXPECT_STREQ(d[26].name, "lnf.weight");
  EXPECT_STREQ(d[27].name, "lnf.bias");

  // The last of two stages holds layer 1, the final LayerNorm and the head's copy of wte.
  auto last = gpt.plugin().describe(gpt.dims(), keel_stage{1, 2, 1, 2, 1, 2});
  ASSERT_EQ(last.size(), 12u + 3);
  EXPECT_STREQ(last[0].name, "h.1.ln1.weight");
  EXPECT_STREQ(last[14].name, "wte");
  EXPECT_EQ(last[14].flags, KEEL_PARAM_WEIGHT_DECAY | KEEL_PARAM_TIED_COPY);
}

TEST(GptPlugin, ValidateNamesFieldAndValue) {
  GptHarness gpt(tiny_dims(0.02f), kB, kT);
  auto refusal = [&](keel_model_dims dims, keel_stage stage) -> std::string {
    try {
      gpt.plugin().describe(dims, stage);
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
      {tiny_dims(0.02f), {0, 3, 0, 1, 0, 2}, "num_heads = 4 is not divisible by tp_size = 3"},
      {dims([](auto& d) { d.hidden_size = 18; }), one,
       "hidden_size = 18 is not divisible by num_heads = 4"},
      {dims([](auto& d) { d.ffn_hidden_size = 66; }),
       {0, 4, 0, 1, 0, 2},
       "ffn_hidden_size = 66 is not divisible by tp_size = 4"},
      {dims([](auto& d) { d.padded_vocab_size = 70; }),
       {0, 4, 0, 1, 0, 2},
       "padded_vocab_size = 70 is not divisible by tp_size = 4"},
      {dims([](auto& d) { d.vocab_size = 80; }), one,
       "padded_vocab_size = 72 is smaller than vocab_size = 80"},
      {dims([](auto& d) { d.seq_len = 0; }), one, "seq_len = 0"},
      {dims([](auto& d) { d.num_layers = 0; }), {0, 1, 0, 1, 0, 0}, "num_layers = 0"},
      {dims([](auto& d) { d.init_std = 0; }), one, "init_std = 0"},
      {tiny_dims(0.02f), {0, 1, 0, 1, 0, 3}, "layer_end = 3"},
      {tiny_dims(0.02f), {0, 1, 0, 2, 1, 2}, "layer_begin = 1 on pp_rank 0"},
      {tiny_dims(0.02f), {0, 1, 1, 2, 1, 1}, "layer_end = 1"},
      {tiny_dims(0.02f), {0, 1, 1, 2, 0, 1}, "layer_end = 1 on the last pp_rank 1"},
      {tiny_dims(0.02f), {2, 2, 0, 1, 0, 2}, "tp_rank = 2 is outside [0, tp_size = 2)"},
  };
  for (const Case& c : cases) {
    std::string msg = refusal(c.dims, c.stage);
    EXPECT_NE(msg.find(c.want), std::string::npos) << "want '" << c.want << "', got: " << msg;
    EXPECT_NE(msg.find("gpt2"), std::string::npos) << msg;
  }
  EXPECT_EQ(refusal(tiny_dims(0.02f), {1, 4, 1, 2, 1, 2}), "accepted");
}

TEST(GptPlugin, EntryServesOnlyItsAbiVersion) {
  GptHarness gpt(tiny_dims(0.02f), kB, kT);
  EXPECT_STREQ(gpt.plugin().table().name, "gpt2");
  EXPECT_EQ(gpt.plugin().table().abi_version, KEEL_PLUGIN_ABI_VERSION);
  // The loader already asked for ABI 3; a runtime asking for another gets no table.
  void* handle = dlopen((bin_dir() + "/libkeel_gpt.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto entry = reinterpret_cast<keel_plugin_entry_fn>(dlsym(handle, KEEL_PLUGIN_ENTRY_SYMBOL));
  ASSERT_NE(entry, nullptr);
  EXPECT_NE(entry(3), nullptr);
  EXPECT_EQ(entry(2), nullptr);
  EXPECT_EQ(entry(4), nullptr);
  dlclose(handle);
}

}  // namespace
}  // namespace keel::test
