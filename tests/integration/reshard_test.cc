// Checkpoints outlive their layout (issue 30), with real processes and both plugins: a job
// trained at TP2×PP2×DP2 (with and without ZeRO-1) resumes at (1,1,1), (1,2,4), (2,1,2) and
// (4,1,1) from its step with the layout-independent parameter checksum bitwise the saved one,
// and goes on like the original layout within fp32 rounding; keel-launch resumes elsewhere
// too. keel-ckpt exports it as Hugging Face safetensors + config.json (checked from Python,
// against a reference forward in Hugging Face's conventions, and read back as
// model.init_checkpoint bitwise) and as llm.c's file (the bytes --export-llmc writes); another
// model, an impossible layout, a missing rank file, a corrupt checkpoint and a Hugging Face
// directory of another shape are refused naming the field, file or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "tests/integration/worker_harness.h"
#include "tests/test_expect.h"
#include "tests/test_paths.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 8, kEvery = 4, kMore = 10;

std::string layout(int tp, int pp, int dp, bool zero1 = false) {
  const int n = tp * pp * dp;
  return (n > 1 ? "--nproc " + std::to_string(n) + " " : std::string()) +
         "--set parallel.tp=" + std::to_string(tp) + " --set parallel.pp=" + std::to_string(pp) +
         " --set parallel.dp=" + std::to_string(dp) +
         " --set parallel.zero1=" + (zero1 ? "true" : "false");
}

// One job at TP2×PP2×DP2 that saved steps 4 and 8, per model and ZeRO-1 setting: made once
// per test binary, the tests only read it.
struct Source {
  std::string dir, cfg, ckpt;
  WorkerRun run;
};
const Source& source(TestModel model, bool zero1) {
  static std::map<std::pair<TestModel, bool>, Source> made;
  auto it = made.find({model, zero1});
  if (it != made.end()) return it->second;
  Source s;
  s.dir = temp_dir("reshard_src_" + test_model_name(model) + (zero1 ? "_zero1" : ""));
  s.cfg = write_config(s.dir, {}, model);
  s.ckpt = s.dir + "/ckpt";
  s.run = run_worker(
      s.dir,
      "--config " + s.cfg + " --set train.eval_every=0 " + layout(2, 2, 2, zero1) +
          " --set train.steps=" + std::to_string(kSteps) +
          " --set checkpoint.persistent_every_steps=" + std::to_string(kEvery) +
          " --set checkpoint.dir=" + s.ckpt +
          (model == TestModel::kGpt ? " --export-llmc " + s.dir + "/trained.bin" : std::string()));
  return made.emplace(std::make_pair(model, zero1), std::move(s)).first->second;
}

// Resumes `src` in `lay` for `steps` steps; its own checkpoints go elsewhere.
WorkerRun resume(const Source& src, const std::string& lay, int steps, const std::string& tag) {
  const std::string dir = temp_dir("reshard_" + tag);
  return run_worker(dir,
                    "--config " + src.cfg + " " + lay +
                        " --set train.eval_every=0 --set train.steps=" + std::to_string(steps) +
                        " --set checkpoint.dir=" + dir + "/ckpt --resume " + src.ckpt);
}

double final_loss(const WorkerRun& r) {
  return json_number_field(r.report, "final_loss");
}

class Reshard : public testing::TestWithParam<TestModel> {};

TEST_P(Reshard, ResumesInAnyLayoutBitwiseAndTrainsOnAlike) {
  const Source& src = source(GetParam(), false);
  ASSERT_EQ(src.run.exit_code, 0) << src.run.output;
  const std::string saved = json_string_field(src.run.report, "param_checksum");
  // The original layout's continuation, the reference for the others.
  const WorkerRun cont = resume(src, layout(2, 2, 2), kMore, "cont");
  ASSERT_EQ(cont.exit_code, 0) << cont.output;
  for (auto [tp, pp, dp] : {std::tuple{1, 1, 1}, {1, 2, 4}, {2, 1, 2}, {4, 1, 1}}) {
    const std::string lay = layout(tp, pp, dp);
    SCOPED_TRACE(lay);
    const WorkerRun loaded = resume(src, lay, kSteps, "load");
    ASSERT_EQ(loaded.exit_code, 0) << loaded.output;
    expect_resumed(loaded.report, kSteps, kSteps);
    EXPECT_EQ(json_string_field(loaded.report, "param_checksum"), saved);
    if (tp == 2) {  // one continuation per model keeps the suite's time
      const WorkerRun more = resume(src, lay, kMore, "more");
      ASSERT_EQ(more.exit_code, 0) << more.output;
      expect_resumed(more.report, kSteps, kMore);
      EXPECT_NEAR(final_loss(more), final_loss(cont), 1e-4 * std::abs(final_loss(cont)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Reshard, testing::Values(TestModel::kGpt, TestModel::kLlama),
                         [](const auto& p) { return test_model_name(p.param); });

// The AdamW moments of a ZeRO-1 checkpoint are shards of each replica: into one rank without
// ZeRO-1, and into another ZeRO-1 split, then trained on like the ZeRO-1 original.
TEST(ReshardZeroOne, ShardedMomentsIntoOtherSplits) {
  const Source& src = source(TestModel::kGpt, true);
  ASSERT_EQ(src.run.exit_code, 0) << src.run.output;
  const std::string saved = json_string_field(src.run.report, "param_checksum");
  const WorkerRun one = resume(src, layout(1, 1, 1, false), kSteps, "z111");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(json_string_field(one.report, "param_checksum"), saved);
  const WorkerRun cont = resume(src, layout(2, 2, 2, true), kMore, "zcont");
  const WorkerRun more = resume(src, layout(1, 2, 4, true), kMore, "z124");
  ASSERT_EQ(more.exit_code, 0) << more.output;
  expect_resumed(more.report, kSteps, kMore);
  EXPECT_NEAR(final_loss(more), final_loss(cont), 1e-4 * std::abs(final_loss(cont)));
}

// keel-launch hands the checkpoint to its slots' workers: 4 ranks at TP2×DP2 on 2 slots.
TEST(ReshardLaunch, ResumesAnotherLayoutOnSlots) {
  const Source& src = source(TestModel::kGpt, false);
  ASSERT_EQ(src.run.exit_code, 0) << src.run.output;
  const std::string dir = temp_dir("reshard_launch");
  const JobRun r =
      run_launch_job(dir, "--local 2 --workers-per-slot 2 --config " + src.cfg +
                              " --set parallel.tp=2 --set parallel.pp=1 --set parallel.dp=2 "
                              "--set train.eval_every=0 --set train.steps=" +
                              std::to_string(kSteps) + " --set checkpoint.dir=" + dir +
                              "/ckpt --resume " + src.ckpt);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_resumed(r.report, kSteps, kSteps);
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(src.run.report, "param_checksum"));
}

std::string ckpt_tool(const std::string& dir, const std::string& args, int* rc) {
  const Ran r = run_in(dir, bin_dir() + "/keel-ckpt " + args, 120);
  *rc = r.rc;
  return r.out + r.err;
}

// Exported for Hugging Face (the header and config as transformers reads them; the loss of a
// reference forward in Hugging Face's conventions equal to keel's), read back as
// model.init_checkpoint into another layout bitwise; for llm.c the bytes --export-llmc wrote.
TEST_P(Reshard, ExportsHuggingFaceAndImportsItBack) {
  const Source& src = source(GetParam(), false);
  ASSERT_EQ(src.run.exit_code, 0) << src.run.output;
  const std::string dir = temp_dir("reshard_hf"), hf = dir + "/hf";
  int rc = 0;
  std::string out = ckpt_tool(dir, "inspect " + src.ckpt, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_HAS(out, "step 8: ok, every file's size and checksum verified");
  EXPECT_HAS(out, "layout  tp 2 pp 2 dp 2");
  out = ckpt_tool(dir, "export --format hf " + src.ckpt + " " + hf, &rc);
  ASSERT_EQ(rc, 0) << out;
  const bool gpt = GetParam() == TestModel::kGpt;
  const Ran py = run_in(dir, "python3 " + source_dir() + "/tests/hf_export_check.py " + hf + " " +
                                 (gpt ? "gpt2" : "llama") + " 2 32");
  ASSERT_EQ(py.rc, 0) << py.out << py.err;
  std::cout << "[ python   ] " << py.out;  // says whether transformers loaded it, or why not
  const WorkerRun back =
      run_worker(dir, "--config " + src.cfg + " " + layout(1, 2, 1) +
                          " --set train.steps=0 --set model.init_checkpoint=" + hf);
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_EQ(json_string_field(back.report, "param_checksum"),
            json_string_field(src.run.report, "param_checksum"));
  // The export read with the field's conventions (tests/hf_reference.py): the loss of the
  // first step's 8 sequences is keel's, from the same weights.
  const WorkerRun step = run_worker(dir, "--config " + src.cfg +
                                             " --set train.steps=1 --set train.eval_every=0 "
                                             "--set model.init_checkpoint=" +
                                             hf);
  ASSERT_EQ(step.exit_code, 0) << step.output;
  const Ran ref = run_in(dir,
                         "python3 " + source_dir() + "/tests/hf_reference.py " + hf + " " +
                             demo_data_dir() + "/train_000000.bin 8",
                         120);
  ASSERT_EQ(ref.rc, 0) << ref.err;
  const std::vector<double> losses = json_array_field(step.report, "losses");
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_NEAR(losses[0], std::stod(ref.out), 1e-4 * losses[0]);
  if (!gpt) {
    EXPECT_NE(ckpt_tool(dir, "export --format llmc " + src.ckpt + " " + dir + "/l.bin", &rc)
                  .find("--format llmc holds llm.c's GPT-2 only"),
              std::string::npos);
    return;
  }
  out = ckpt_tool(dir, "export --format llmc " + src.ckpt + "/step_000008 " + dir + "/m.bin", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(read_text(dir + "/m.bin"), read_text(src.dir + "/trained.bin"));
}

// Each refusal comes before any step and names what does not fit.
TEST(ReshardRefusals, NameTheFieldFileOrTensor) {
  const Source& src = source(TestModel::kGpt, false);
  ASSERT_EQ(src.run.exit_code, 0) << src.run.output;
  const std::string dir = temp_dir("reshard_refuse");
  const WorkerRun other =
      resume(src, layout(1, 1, 1) + " --set model.hidden_size=64", kSteps, "refuse_model");
  EXPECT_NE(other.exit_code, 0);
  EXPECT_HAS(other.output, "model.hidden_size = 32 in the checkpoint, 64 in this job");
  const WorkerRun llama = run_worker(
      dir, "--config " + write_config(dir, {}, TestModel::kLlama) + " --resume " + src.ckpt);
  EXPECT_NE(llama.exit_code, 0);
  EXPECT_HAS(llama.output, "plugin_name = \"gpt2\" (this job: \"llama\")");
  const WorkerRun bad = resume(src, layout(3, 1, 1), kSteps, "refuse_layout");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_HAS(bad.output, "parallel.tp = 3: must divide");

  // A step missing a rank's file is passed over, naming the file; with none left, refused.
  const std::string broken = dir + "/broken";
  fs::copy(src.ckpt, broken, fs::copy_options::recursive);
  fs::remove(broken + "/step_000008/rank_3.bin");
  fs::remove_all(broken + "/step_000004");
  const WorkerRun missing =
      run_worker(dir, "--config " + src.cfg + " " + layout(1, 1, 1) + " --resume " + broken);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_HAS(missing.output, "step_000008/rank_3.bin: missing");

  // A corrupt checkpoint is not exported; the file is named.
  fs::copy(src.ckpt + "/step_000008", broken + "/step_000008",
           fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  {
    std::fstream f(broken + "/step_000008/rank_5.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  int rc = 0;
  const std::string out = ckpt_tool(dir, "export --format hf " + broken + " " + dir + "/hf", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_HAS(out, "step_000008/rank_5.bin: checksum mismatch");
  EXPECT_FALSE(fs::exists(dir + "/hf/model.safetensors"));

  // A Hugging Face directory of another shape: the field of config.json, or (without one) the
  // first tensor that does not fit.
  ASSERT_EQ(ckpt_tool(dir, "export --format hf " + src.ckpt + " " + dir + "/hf", &rc).empty(),
            false);
  ASSERT_EQ(rc, 0);
  const std::string wide = "--config " + src.cfg +
                           " --set train.steps=0 --set model.hidden_size=64 "
                           "--set model.init_checkpoint=" +
                           dir + "/hf";
  EXPECT_HAS(run_worker(dir, wide).output, "config.json: n_embd = 32, this job's model has 64");
  fs::remove(dir + "/hf/config.json");
  EXPECT_HAS(run_worker(dir, wide).output,
             "model.safetensors: tensor 'transformer.wte.weight' has shape [256, 32], this model "
             "needs [256, 64] (for wte)");
}

}  // namespace
}  // namespace keel::test
