// What a new user tries first (issue 43, items 3, 4, 5, 9 and the weak ones), one table per
// binary, each case the real binary: its exit status, a fragment of its message, and what it
// must not have written. keel-ckpt never writes over the checkpoint it reads and checks a
// --plugin as export does; keel-worker refuses a resume past train.steps, a Hugging Face
// config.json of another model and a directory that holds no weights, before any step; keel-launch
// and keel-ctl refuse a bad flag by its name with exit 2. (keel-bench's NaN cases are in
// tests/bench/keel_bench_cli_test.cc, the shared check in tests/runtime/cli_test.cc.)
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/integration/worker_harness.h"
#include "tests/test_expect.h"
#include "tests/test_paths.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;

// One command and what it must do: exit with `rc`, say `said`, and leave `absent` unmade.
struct Case {
  std::string args;
  int rc;
  std::string said;
  std::string absent = "";
};

// A tiny GPT trained 4 steps that sealed steps 2 and 4 in DIR/ck: made once, only read.
struct Source {
  std::string dir, cfg, ck;
  WorkerRun run;
};
const Source& source() {
  static Source s = [] {
    Source s;
    s.dir = temp_dir("first-tries-src");
    s.cfg = write_config(s.dir);
    s.ck = s.dir + "/ck";
    s.run = run_worker(s.dir, "--config " + s.cfg +
                                  " --set train.steps=4 --set train.eval_every=0"
                                  " --set checkpoint.persistent_every_steps=2"
                                  " --set checkpoint.dir=" +
                                  s.ck);
    return s;
  }();
  return s;
}

// Every file under `dir` with its bytes: what "nothing written over" compares.
std::map<std::string, std::string> contents(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[e.path().string()] = read_text(e.path().string());
  return out;
}

TEST(FirstTries, KeelCkptNeverWritesIntoItsInputAndChecksThePlugin) {
  const Source& src = source();
  ASSERT_EQ(src.run.exit_code, 0) << src.run.output;
  const std::string dir = temp_dir("first-tries-ckpt");
  const std::string step = src.ck + "/step_000004";
  fs::create_symlink(step + "/rank_0.bin", dir + "/link.bin");
  fs::create_hard_link(step + "/rank_0.bin", dir + "/hard.bin");
  // A step whose manifest is empty, beside the checkpoint.
  fs::create_directories(dir + "/empty/step_000004");
  fs::copy(step, dir + "/empty/step_000004", fs::copy_options::recursive);
  std::ofstream(dir + "/empty/step_000004/manifest.pb", std::ios::trunc);
  const std::map<std::string, std::string> before = contents(src.ck);
  const std::string bin = bin_dir() + "/";
  const Case cases[] = {
      // Item 3: the output is the checkpoint's own file, by its path, a symbolic or a hard link.
      {"export --format llmc " + src.ck + " " + step + "/rank_0.bin", 2,
       step + "/rank_0.bin: is inside the checkpoint being read ("},
      {"export --format llmc " + src.ck + " " + dir + "/link.bin", 2,
       dir + "/link.bin: is inside the checkpoint being read"},
      {"export --format llmc " + src.ck + " " + dir + "/hard.bin", 2,
       dir + "/hard.bin: is a link to the checkpoint's file " + step + "/rank_0.bin"},
      // ... or anywhere inside the checkpoint's directory.
      {"export --format llmc " + step + " " + src.ck + "/gpt2.bin", 2,
       src.ck + "/gpt2.bin: is inside the checkpoint being read", src.ck + "/gpt2.bin"},
      {"export --format hf " + src.ck + " " + src.ck + "/hf", 2,
       src.ck + "/hf: is inside the checkpoint being read", src.ck + "/hf"},
      // Item 3: a plugin of another model, refused by inspect as by export.
      {"inspect --plugin " + bin + "libkeel_llama.so " + src.ck, 2,
       "plugin_name = \"gpt2\" in the checkpoint, \"llama\" in --plugin " + bin +
           "libkeel_llama.so"},
      {"export --format hf --plugin " + bin + "libkeel_llama.so " + src.ck + " " + dir + "/hf", 2,
       "plugin_name = \"gpt2\" in the checkpoint, \"llama\"", dir + "/hf"},
      {"inspect --plugin " + bin + "libkeel_gpt_renamed.so " + src.ck, 2,
       "the plugin's parameter table for this rank gives"},
      {"inspect --plugin " + dir + " " + src.ck, 2,
       "plugin " + dir + ": is a directory, expected a plugin's shared object (.so)"},
      // Weak ones: no command, a command it does not have, an empty manifest.
      {"", 2, "a command is needed: keel-ckpt's commands are inspect DIR and export --format"},
      {"import", 2, "import: not a command; a job reads weights itself"},
      {"import " + dir + "/hf " + src.ck, 2, "--set model.init_checkpoint=PATH"},
      {"export --format llmc " + dir + "/empty " + dir + "/e.bin", 2,
       "step_000004/manifest.pb: empty (0 bytes), not a manifest", dir + "/e.bin"},
      // What works still does.
      {"inspect --plugin " + bin + "libkeel_gpt.so " + src.ck, 0, " parameters"},
      {"inspect " + dir + "/empty", 0, "UNUSABLE: step_000004/manifest.pb: empty (0 bytes)"},
      {"export --format llmc " + src.ck + " " + dir + "/out.bin", 0, "(llm.c GPT-2, fp32)"},
  };
  for (const Case& c : cases) {
    const Ran r = run_in(dir, bin + "keel-ckpt " + c.args, 60);
    EXPECT_EQ(r.rc, c.rc) << c.args << "\n" << r.out << r.err;
    EXPECT_HAS(r.out + r.err, c.said);
    if (c.rc == 2) {
      EXPECT_EQ(r.err.rfind("keel-ckpt: error: ", 0), 0u) << r.err;
    }
    if (!c.absent.empty()) {
      EXPECT_FALSE(fs::exists(c.absent)) << c.args;
    }
  }
  // Nothing of the checkpoint was written over, and nothing was added to it.
  EXPECT_EQ(contents(src.ck), before);
  EXPECT_TRUE(fs::exists(dir + "/out.bin"));
}

// Refused before anything started: exit 2, `part` in the output, no report, no process and no
// shared memory left.
void expect_refused(const JobRun& r, const std::string& part) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_HAS(r.output, part);
  EXPECT_TRUE(r.report.empty()) << "it trained:\n" << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

int count_of(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

TEST(FirstTries, KeelWorkerRefusesWhatCannotTrainBeforeAnyStep) {
  const Source& src = source();
  ASSERT_EQ(src.run.exit_code, 0) << src.run.output;
  const std::string dir = temp_dir("first-tries-worker");
  fs::create_directories(dir + "/llama");
  const std::string llama = write_config(dir + "/llama", {}, TestModel::kLlama);
  // Hugging Face directories whose config.json differs from the model in one field each:
  // the config is read before any tensor, so an empty model.safetensors is enough.
  auto hf = [&](const std::string& name, const std::string& json) {
    fs::create_directories(dir + "/" + name);
    std::ofstream(dir + "/" + name + "/model.safetensors");
    std::ofstream(dir + "/" + name + "/config.json") << json;
    return dir + "/" + name;
  };
  const std::string relu = hf("relu", R"({"model_type": "gpt2", "activation_function": "relu"})");
  const std::string untied =
      hf("untied", R"({"model_type": "gpt2", "n_embd": 32, "tie_word_embeddings": false})");
  const std::string gelu = hf("gelu", R"({"model_type": "llama", "hidden_act": "gelu"})");
  const std::string tied = hf("tied", R"({"model_type": "llama", "tie_word_embeddings": true})");
  const std::string scaled =
      hf("scaled", R"({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2}})");
  fs::create_directories(dir + "/empty");
  const std::string gpt = "--config " + src.cfg + " ";
  const std::string lla = "--config " + llama + " ";
  const Case cases[] = {
      // Item 4: a resume past train.steps.
      {gpt + "--resume " + src.ck + " --set train.steps=2", 2,
       src.ck + "/step_000004: checkpoint step 4 is past train.steps = 2: nothing is left to "
                "train"},
      // ... said once by a --nproc job, not by each rank.
      {gpt + "--nproc 2 --set parallel.dp=2 --resume " + src.ck + " --set train.steps=2", 2,
       "checkpoint step 4 is past train.steps = 2"},
      // Item 5: every field of config.json that changes the model.
      {gpt + "--set model.init_checkpoint=" + relu, 2,
       relu + "/config.json: activation_function = \"relu\", this job's model has \"gelu_new\""},
      {gpt + "--set model.init_checkpoint=" + untied, 2,
       untied + "/config.json: tie_word_embeddings = false, this job's model has true"},
      {lla + "--set model.init_checkpoint=" + gelu, 2,
       gelu + "/config.json: hidden_act = \"gelu\", this job's model has \"silu\""},
      {lla + "--set model.init_checkpoint=" + tied, 2,
       tied + "/config.json: tie_word_embeddings = true, this job's model has false"},
      {lla + "--set model.init_checkpoint=" + scaled, 2, scaled + "/config.json: rope_scaling = {"},
      // Item 5: a directory that holds no weights says what is missing, or that it is a resume.
      {gpt + "--set model.init_checkpoint=" + dir + "/empty", 2,
       "model.init_checkpoint = " + dir + "/empty: a directory without model.safetensors"},
      {gpt + "--set model.init_checkpoint=" + src.ck, 2,
       "model.init_checkpoint = " + src.ck +
           ": is a keel checkpoint; a job goes on from one "
           "with --resume " +
           src.ck},
      {gpt + "--set model.init_checkpoint=" + src.ck + "/step_000004", 2,
       "is a keel checkpoint; a job goes on from one with --resume"},
      // Weak ones: a repeated field as a list, a directory as the plugin.
      {gpt + "--set parallel.stage_layers=[2,0]", 2,
       "parallel.stage_layers = [2,0]: every stage needs at least one layer"},
      {gpt + "--set model.plugin=" + dir, 2,
       "plugin " + dir + ": is a directory, expected a plugin's shared object (.so)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const JobRun r = run_job(dir, c.args, {}, 60);
    expect_refused(r, c.said);
    EXPECT_EQ(count_of(r.output, "error:"), 1) << r.output;
  }
  // A resume with another global batch goes on, saying once that the data position moves.
  const JobRun r = run_job(dir,
                           gpt + "--resume " + src.ck +
                               " --set train.steps=5 --set train.eval_every=0 "
                               "--set train.global_batch_size=16",
                           {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string warned = "written with train.global_batch_size = 8, this job's is 16";
  EXPECT_EQ(count_of(r.output, warned), 1) << r.output;
  // At train.steps exactly, the state loads and nothing trains.
  const JobRun at_end = run_job(dir, gpt + "--resume " + src.ck + " --set train.steps=4", {}, 60);
  EXPECT_EQ(at_end.exit_code, 0) << at_end.output;
}

// A one-rank job under each launcher trains to its end (issue 43, item 1): its rank once
// waited for ever for an epoch record that the controller wrote to the job's store while the
// rank read a store of its own.
TEST(FirstTries, AOneRankJobTrainsUnderEveryLauncher) {
  const std::string dir = temp_dir("first-tries-one-rank");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 1"}});
  const std::string job = "--config " + cfg + " --set train.steps=6 --set train.eval_every=0 ";
  const JobRun nproc = run_job(temp_dir("first-tries-one-rank-nproc"), job + "--nproc 1", {}, 120);
  EXPECT_EQ(nproc.exit_code, 0) << nproc.output;
  EXPECT_EQ(json_number_field(nproc.report, "steps_completed"), 6) << nproc.report;
  const JobRun local =
      run_launch_job(temp_dir("first-tries-one-rank-local"), job + "--local 1", {}, 120);
  EXPECT_EQ(local.exit_code, 0) << local.output;
  EXPECT_EQ(json_number_field(local.report, "steps_completed"), 6) << local.report;
  EXPECT_EQ(json_string_field(local.report, "param_checksum"),
            json_string_field(nproc.report, "param_checksum"));
  EXPECT_EQ(local.leftover_processes, 0) << local.output;
  EXPECT_TRUE(local.leftover_shm.empty()) << local.output;
}

// An --etcd that answers nothing (issue 43, item 2): the start says so naming the endpoint
// within seconds, and answers SIGTERM meanwhile with 128 + 15, leaving nothing behind.
TEST(FirstTries, AnUnreachableEtcdIsNamedAndASignalEndsTheWait) {
  const std::string dir = temp_dir("first-tries-etcd");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  const std::string job = "--config " + cfg + " --local 2 --etcd 127.0.0.1:1 --set train.steps=5";
  const JobRun said = run_launch_job(temp_dir("first-tries-etcd-said"), job, {}, 60);
  EXPECT_EQ(said.exit_code, 1) << said.output;
  EXPECT_HAS(said.output, "etcd (the cluster at 127.0.0.1:1) did not answer within");
  EXPECT_EQ(said.leftover_processes, 0) << said.output;
  const auto t0 = std::chrono::steady_clock::now();
  bool sent = false;
  const JobRun stopped = run_launch_job(
      temp_dir("first-tries-etcd-term"), job,
      [&](pid_t launcher) {
        // Once the slots are up and the wait for etcd has begun.
        if (sent || std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) return;
        kill(launcher, SIGTERM);
        sent = true;
      },
      60);
  ASSERT_TRUE(sent) << stopped.output;
  EXPECT_EQ(stopped.exit_code, 128 + SIGTERM) << stopped.output;
  EXPECT_HAS(stopped.output,
             "stopped by a signal while waiting for etcd (the cluster at 127.0.0.1:1)");
  EXPECT_EQ(stopped.leftover_processes, 0) << stopped.output;
}

// One owner per checkpoint directory whatever starts the job (issue 43, item 6): while a lone
// keel-worker writes its checkpoints, another lone one and a keel-worker --nproc 2 pointed at
// the same directory are refused at their start, told which job writes there.
TEST(FirstTries, ALoneWorkerHoldsItsCheckpointDirectory) {
  const std::string dir = temp_dir("first-tries-ckpt-owner");
  const std::string ck = dir + "/ck";
  const std::string cfg = write_config(dir, {{"parallel", "dp: 1"}});
  const std::string sets = " --set checkpoint.persistent_every_steps=5 --set checkpoint.dir=" + ck +
                           " --set train.eval_every=0 ";
  std::vector<JobRun> others;
  // The first, paced (30 ms a step) so that it still writes while the others start.
  const JobRun first = run_job(
      temp_dir("first-tries-ckpt-owner-a"),
      "--config " + cfg + sets +
          "--set train.steps=400 --fault slow@step=0,rank=0,delay_ms=30 --set "
          "detect.slow_round_steps=0",
      [&](pid_t) {
        if (!others.empty() || !fs::exists(ck + "/.keel-owner")) return;
        others.push_back(run_job(temp_dir("first-tries-ckpt-owner-b"),
                                 "--config " + cfg + sets + "--set train.steps=10", {}, 60));
        others.push_back(run_job(temp_dir("first-tries-ckpt-owner-c"),
                                 "--config " + cfg + sets +
                                     "--set train.steps=10 --set "
                                     "parallel.dp=2 --nproc 2",
                                 {}, 60));
      },
      300);
  EXPECT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(others.size(), 2u) << first.output;
  for (const JobRun& r : others) {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_HAS(r.output, "is writing its checkpoints there");
  }
}

TEST(FirstTries, KeelLaunchAndKeelCtlRefuseABadFlagByItsName) {
  const std::string dir = temp_dir("first-tries-flags");
  const std::string cfg = write_config(dir);
  std::ofstream(dir + "/file") << "x";
  const std::string launch = bin_dir() + "/keel-launch --local 2 --config " + cfg + " ";
  const std::string ctl = bin_dir() + "/keel-ctl ";
  const Case cases[] = {
      {launch + "--run-dir " + dir + "/file", 2,
       "--run-dir " + dir + "/file: is a file, expected a directory"},
      {launch + "--run-dir " + dir + "/file/runs", 2,
       "--run-dir " + dir + "/file/runs: " + dir +
           "/file is a file, so the directory cannot be "
           "made"},
      {launch + "--etcd foo", 2, "--etcd foo: expected host:port of each member"},
      {launch + "--etcd 127.0.0.1:2379,127.0.0.1:99999", 2, "'99999' is not a port"},
      {ctl + "update --plugin " + dir + "/none.so --run " + dir, 2,
       "--plugin " + dir + "/none.so: no such file"},
      {ctl + "update --plugin " + dir + " --run " + dir, 2,
       "--plugin " + dir + ": is a directory, expected a plugin's shared object (.so)"},
      {ctl + "plan-standby --machines 10 --mtbf-hours nan --recovery-minutes 5", 2,
       "--mtbf-hours nan: must be a finite number"},
  };
  for (const Case& c : cases) {
    const Ran r = run_in(dir, c.args, 30);
    EXPECT_EQ(r.rc, c.rc) << c.args << "\n" << r.out << r.err;
    EXPECT_HAS(r.err, c.said);
    EXPECT_FALSE(contains(r.err, "filesystem error")) << r.err;
  }
  // Nothing was made: no run directory beside the file, nothing under the working directory.
  EXPECT_FALSE(fs::exists(dir + "/runs")) << "a run directory was made";
}

}  // namespace
}  // namespace keel::test
