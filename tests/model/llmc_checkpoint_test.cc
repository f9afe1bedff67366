// llm.c checkpoints: bit-exact round trips, llm.c's tensor order in the file, and errors that
// name the file, the header field and both values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "model/llmc_checkpoint.h"
#include "runtime/check.h"
#include "runtime/rng.h"
#include "tests/test_expect.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

template <typename F>
std::string error_of(F&& f) {
  return test::input_error_of(std::forward<F>(f));
}

keel_model_dims small_dims() {
  keel_model_dims d{};
  d.num_layers = 3;
  d.hidden_size = 8;
  d.num_heads = 2;
  d.ffn_hidden_size = 32;
  d.seq_len = 6;
  d.vocab_size = 10;
  d.padded_vocab_size = 16;
  d.init_std = 0.02f;
  return d;
}

// Random tensors, with a few values that a lossy path would change (the largest float, −0,
// denormal). No NaN: a checkpoint holding one is refused at load (NonFiniteWeightIsNamed).
NamedTensors random_tensors(const keel_model_dims& d) {
  NamedTensors t;
  uint64_t idx = 0;
  for (const auto& spec : llmc_tensor_layout(d)) {
    auto& v = t[spec.name];
    v.resize(size_t(spec.numel()));
    for (auto& x : v) x = rng::normal(5, 0, idx++);
  }
  t["wte"][0] = std::numeric_limits<float>::max();
  t["wpe"][1] = -0.0f;
  t["lnf.bias"][0] = std::numeric_limits<float>::denorm_min();
  return t;
}

TEST(LlmcTest, LayoutHasLlmcsTensorsInFileOrder) {
  keel_model_dims d = small_dims();
  std::vector<LlmcTensor> layout = llmc_tensor_layout(d);
  ASSERT_EQ(layout.size(), 2u + 12u * 3u + 2u);
  EXPECT_EQ(layout[0].name, "wte");
  EXPECT_EQ(layout[0].shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(layout[1].name, "wpe");
  EXPECT_EQ(layout[1].shape, (std::vector<int64_t>{6, 8}));
  // Each llm.c tensor holds all layers: ln1w for layers 0..2, then ln1b, ...
  EXPECT_EQ(layout[2].name, "h.0.ln1.weight");
  EXPECT_EQ(layout[3].name, "h.1.ln1.weight");
  EXPECT_EQ(layout[4].name, "h.2.ln1.weight");
  EXPECT_EQ(layout[5].name, "h.0.ln1.bias");
  EXPECT_EQ(layout[8].name, "h.0.attn.qkv.weight");
  EXPECT_EQ(layout[8].shape, (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(layout[32].name, "h.0.mlp.proj.weight");
  EXPECT_EQ(layout[32].shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(layout[38].name, "lnf.weight");
  EXPECT_EQ(layout[39].name, "lnf.bias");
  // The total is llm.c's num_parameters for these dims.
  int64_t total = 0;
  for (const auto& t : layout) total += t.numel();
  const int64_t C = 8, L = 3, Vp = 16, maxT = 6;
  int64_t llmc = Vp * C + maxT * C + L * C + L * C + L * 3 * C * C + L * 3 * C + L * C * C + L * C +
                 L * C + L * C + L * 4 * C * C + L * 4 * C + L * C * 4 * C + L * C + C + C;
  EXPECT_EQ(total, llmc);
}

TEST(LlmcTest, WriteReadRoundTripsBitForBit) {
  std::string dir = test::temp_dir("llmc");
  keel_model_dims d = small_dims();
  NamedTensors t = random_tensors(d);
  std::string path = dir + "/model.bin";
  write_llmc_checkpoint(path, d, t);
  // Nothing but the checkpoint is left in the folder (the temporary was renamed).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);

  LlmcHeader h = read_llmc_header(path);
  EXPECT_EQ(h.magic, 20240326);
  EXPECT_EQ(h.version, 3);
  EXPECT_EQ(h.max_seq_len, 6);
  EXPECT_EQ(h.vocab_size, 10);
  EXPECT_EQ(h.num_layers, 3);
  EXPECT_EQ(h.num_heads, 2);
  EXPECT_EQ(h.channels, 8);
  EXPECT_EQ(h.padded_vocab_size, 16);

  NamedTensors back = read_llmc_checkpoint(path, d);
  ASSERT_EQ(back.size(), t.size());
  for (const auto& [name, v] : t) {
    ASSERT_EQ(back[name].size(), v.size()) << name;
    EXPECT_EQ(std::memcmp(back[name].data(), v.data(), v.size() * 4), 0) << name;
  }
}

TEST(LlmcTest, FileHoldsLlmcsLayout) {
  // Independently of llmc_tensor_layout: the file is the header, then wte, wpe, then ln1w
  // for all layers as one [L, C] block, ... as llm.c's fill_in_parameter_sizes lays it out.
  std::string dir = test::temp_dir("llmc-layout");
  keel_model_dims d = small_dims();
  const int64_t C = 8, L = 3, Vp = 16, maxT = 6;
  NamedTensors t = random_tensors(d);
  write_llmc_checkpoint(dir + "/m.bin", d, t);
  std::ifstream in(dir + "/m.bin", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto at = [&](int64_t float_offset) {
    float f;
    std::memcpy(&f, bytes.data() + 1024 + float_offset * 4, 4);
    return f;
  };
  auto same = [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; };
  int64_t wpe = Vp * C, ln1w = wpe + maxT * C, ln1b = ln1w + L * C, qkvw = ln1b + L * C,
          qkvb = qkvw + L * 3 * C * C, attprojw = qkvb + L * 3 * C, attprojb = attprojw + L * C * C,
          ln2w = attprojb + L * C, ln2b = ln2w + L * C, fcw = ln2b + L * C,
          fcb = fcw + L * 4 * C * C, fcprojw = fcb + L * 4 * C, fcprojb = fcprojw + L * C * 4 * C,
          lnfw = fcprojb + L * C, lnfb = lnfw + C;
  EXPECT_TRUE(same(at(5), t["wte"][5]));
  EXPECT_TRUE(same(at(wpe + 3), t["wpe"][3]));
  EXPECT_TRUE(same(at(ln1w + 2 * C + 1), t["h.2.ln1.weight"][1]));
  EXPECT_TRUE(same(at(ln1b + 1 * C), t["h.1.ln1.bias"][0]));
  EXPECT_TRUE(same(at(qkvw + 1 * 3 * C * C + 7), t["h.1.attn.qkv.weight"][7]));
  EXPECT_TRUE(same(at(qkvb + 2 * 3 * C + 20), t["h.2.attn.qkv.bias"][20]));
  EXPECT_TRUE(same(at(attprojw + C * C + 9), t["h.1.attn.proj.weight"][9]));
  EXPECT_TRUE(same(at(attprojb + 2), t["h.0.attn.proj.bias"][2]));
  EXPECT_TRUE(same(at(ln2w + C + 3), t["h.1.ln2.weight"][3]));
  EXPECT_TRUE(same(at(ln2b + 2 * C), t["h.2.ln2.bias"][0]));
  EXPECT_TRUE(same(at(fcw + 2 * 4 * C * C + 100), t["h.2.mlp.fc.weight"][100]));
  EXPECT_TRUE(same(at(fcb + 4 * C + 31), t["h.1.mlp.fc.bias"][31]));
  EXPECT_TRUE(same(at(fcprojw + 4 * C * C + 255), t["h.1.mlp.proj.weight"][255]));
  EXPECT_TRUE(same(at(fcprojb + 2 * C + 7), t["h.2.mlp.proj.bias"][7]));
  EXPECT_TRUE(same(at(lnfw + 4), t["lnf.weight"][4]));
  EXPECT_TRUE(same(at(lnfb), t["lnf.bias"][0]));
  EXPECT_EQ(int64_t(bytes.size()), 1024 + (lnfb + C) * 4);
}

TEST(LlmcTest, EachHeaderMismatchIsNamed) {
  std::string dir = test::temp_dir("llmc-mismatch");
  keel_model_dims d = small_dims();
  std::string path = dir + "/gpt2.bin";
  write_llmc_checkpoint(path, d, random_tensors(d));
  struct Case {
    int32_t keel_model_dims::*field;
    int32_t value;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {&keel_model_dims::seq_len, 7, "header max_seq_len = 6, config model.seq_len = 7"},
      {&keel_model_dims::vocab_size, 12, "header vocab_size = 10, config model.vocab_size = 12"},
      {&keel_model_dims::num_layers, 2, "header num_layers = 3, config model.num_layers = 2"},
      {&keel_model_dims::num_heads, 4, "header num_heads = 2, config model.num_heads = 4"},
      {&keel_model_dims::hidden_size, 16, "header channels = 8, config model.hidden_size = 16"},
      {&keel_model_dims::padded_vocab_size, 32,
       "header padded_vocab_size = 16, config model.padded_vocab_size = 32"},
  };
  for (const auto& c : cases) {
    keel_model_dims want = d;
    want.*c.field = c.value;
    if (c.field == &keel_model_dims::hidden_size) want.ffn_hidden_size = 4 * c.value;
    EXPECT_HAS(error_of([&] { read_llmc_checkpoint(path, want); }), path + ": " + c.expect);
  }
  keel_model_dims ffn = d;
  ffn.ffn_hidden_size = 40;
  EXPECT_HAS(error_of([&] { read_llmc_checkpoint(path, ffn); }),
             path +
                 ": llm.c checkpoints have an MLP of 4·channels = 32, config "
                 "model.ffn_hidden_size = 40");
}

void patch_int(const std::string& path, int index, int32_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(index * 4);
  f.write(reinterpret_cast<const char*>(&value), 4);
}

TEST(LlmcTest, BadFilesAreNamed) {
  std::string dir = test::temp_dir("llmc-bad");
  keel_model_dims d = small_dims();
  std::string path = dir + "/m.bin";

  write_llmc_checkpoint(path, d, random_tensors(d));
  fs::resize_file(path, fs::file_size(path) - 4);
  EXPECT_HAS(error_of([&] { read_llmc_checkpoint(path, d); }),
             path + ": file size = " + std::to_string(fs::file_size(path)) + " bytes, expected " +
                 std::to_string(fs::file_size(path) + 4));

  fs::resize_file(path, 100);
  EXPECT_HAS(error_of([&] { read_llmc_header(path); }),
             path + ": shorter than the 1024-byte header");

  write_llmc_checkpoint(path, d, random_tensors(d));
  patch_int(path, 0, 20240520);  // a token shard's magic
  EXPECT_HAS(error_of([&] { read_llmc_header(path); }),
             path + ": header magic = 20240520, expected 20240326");

  write_llmc_checkpoint(path, d, random_tensors(d));
  patch_int(path, 1, 5);
  EXPECT_HAS(error_of([&] { read_llmc_checkpoint(path, d); }),
             path + ": header version = 5, expected 3 (fp32); 5 is bf16");

  EXPECT_HAS(error_of([&] { read_llmc_header(dir + "/none.bin"); }),
             dir + "/none.bin: cannot open");
}

TEST(LlmcTest, NonFiniteWeightIsNamed) {
  std::string dir = test::temp_dir("llmc-nan");
  keel_model_dims d = small_dims();
  std::string path = dir + "/m.bin";
  const float bad[] = {std::nanf(""), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (float x : bad) {
    NamedTensors t = random_tensors(d);
    t["h.1.mlp.fc.weight"][37] = x;
    t["h.2.mlp.fc.weight"][0] = x;  // a later one: the first bad element is the one named
    write_llmc_checkpoint(path, d, t);
    std::string e = error_of([&] { read_llmc_checkpoint(path, d); });
    EXPECT_HAS(e, path + ": tensor h.1.mlp.fc.weight element 37 = ");
    EXPECT_HAS(e, "weights must be finite");
  }
}

TEST(LlmcTest, WriteNamesMissingOrWrongTensors) {
  std::string dir = test::temp_dir("llmc-write");
  keel_model_dims d = small_dims();
  std::string path = dir + "/m.bin";

  NamedTensors t = random_tensors(d);
  t.erase("h.1.attn.proj.bias");
  EXPECT_HAS(error_of([&] { write_llmc_checkpoint(path, d, t); }),
             path + ": tensor h.1.attn.proj.bias is missing");

  t = random_tensors(d);
  t["h.2.mlp.fc.weight"].pop_back();
  EXPECT_HAS(error_of([&] { write_llmc_checkpoint(path, d, t); }),
             path + ": tensor h.2.mlp.fc.weight has 255 elements, expected 256");

  t = random_tensors(d);
  t["h.3.ln1.weight"] = std::vector<float>(8);
  EXPECT_HAS(error_of([&] { write_llmc_checkpoint(path, d, t); }),
             path + ": tensor h.3.ln1.weight is not part of");

  keel_model_dims ffn = d;
  ffn.ffn_hidden_size = 24;
  EXPECT_HAS(error_of([&] { write_llmc_checkpoint(path, ffn, random_tensors(d)); }),
             "model.ffn_hidden_size = 24");
  EXPECT_FALSE(fs::exists(path));  // a refused write leaves nothing behind
}

}  // namespace
}  // namespace keel
