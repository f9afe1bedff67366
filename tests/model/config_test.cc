// The job config: parsing, --set overrides, derived defaults, and that every rejected input
// names where it came from, the field and the value.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "proto/config_loader.h"
#include "runtime/check.h"
#include "tests/test_expect.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

// The InputError message of parsing `text` as "cfg.pbtxt" with `overrides`, or a failure.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config_text(text, "cfg.pbtxt", overrides);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError for:\n" << text;
  return "";
}

TEST(ConfigTest, ExampleConfigsParse) {
  config::JobConfig c = load_config(test::source_dir() + "/examples/configs/tiny-gpt.pbtxt", {});
  EXPECT_EQ(c.model().num_layers(), 2);
  EXPECT_EQ(c.model().hidden_size(), 64);
  EXPECT_EQ(c.model().num_heads(), 4);
  EXPECT_EQ(c.model().seq_len(), 64);
  EXPECT_EQ(c.model().vocab_size(), 256);
  EXPECT_EQ(c.model().ffn_hidden_size(), 256);    // derived: 4 · 64
  EXPECT_EQ(c.model().padded_vocab_size(), 256);  // derived: 256 is a multiple of 128
  EXPECT_EQ(c.train().micro_batch_size(), 4);
  EXPECT_EQ(c.train().global_batch_size(), 16);  // the same global batch as the 3-D demo
  EXPECT_EQ(c.optim().schedule(), config::OptimConfig::cosine);
  EXPECT_EQ(c.data().train_files(), "data/demo/train_*.bin");

  config::JobConfig d = load_config(test::source_dir() + "/examples/configs/tiny-gpt-3d.pbtxt", {});
  EXPECT_EQ(d.parallel().tp() * d.parallel().pp() * d.parallel().dp(), 8);
  EXPECT_EQ(d.train().global_batch_size(), 16);
  EXPECT_EQ(d.parallel().stage_layers_size(), 2);
}

TEST(ConfigTest, EmptyTextIsTheDefaultDemo) {
  config::JobConfig c = parse_config_text("", "empty", {});
  EXPECT_EQ(c.model().ffn_hidden_size(), 4 * c.model().hidden_size());
  EXPECT_EQ(c.model().padded_vocab_size(), 256);
}

TEST(ConfigTest, DerivedDefaults) {
  config::JobConfig c =
      parse_config_text("model { hidden_size: 768 num_heads: 12 vocab_size: 50257 }", "gpt2", {});
  EXPECT_EQ(c.model().ffn_hidden_size(), 3072);
  EXPECT_EQ(c.model().padded_vocab_size(), 50304);  // as llm.c pads GPT-2's vocabulary
  // Explicit values are kept.
  c = parse_config_text("model { ffn_hidden_size: 100 padded_vocab_size: 512 }", "x", {});
  EXPECT_EQ(c.model().ffn_hidden_size(), 100);
  EXPECT_EQ(c.model().padded_vocab_size(), 512);
}

TEST(ConfigTest, MissingFile) {
  try {
    load_config("/nonexistent/keel.pbtxt", {});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_HAS(e.what(), "/nonexistent/keel.pbtxt");
  }
}

// A directory opens as an empty stream; parsed, it would be the built-in default config.
TEST(ConfigTest, DirectoryIsNotAConfig) {
  std::string dir = test::temp_dir("config-dir");
  EXPECT_HAS(test::input_error_of([&] { load_config(dir, {}); }),
             dir + ": is a directory, expected a config file");
}

TEST(ConfigTest, ParseErrorsCarryLineAndColumn) {
  std::string e = error_of("model {\n  num_layers: 2\n  num_head: 4\n}\n");
  EXPECT_HAS(e, "cfg.pbtxt:3:3:");
  EXPECT_HAS(e, "num_head");

  e = error_of("optim {\n  schedule: cosin\n}\n");
  EXPECT_HAS(e, "cfg.pbtxt:2:13:");  // the value, though protobuf notices at the next token
  EXPECT_HAS(e, "cosin");
  EXPECT_HAS(e, "schedule");

  e = error_of("train {\n  steps: many\n}\n");
  EXPECT_HAS(e, "cfg.pbtxt:2:");
  EXPECT_HAS(e, "many");

  e = error_of("model { num_layers: 2 num_layers: 3 }");
  EXPECT_HAS(e, "num_layers");
  EXPECT_HAS(e, "cfg.pbtxt:1:");

  e = error_of("model { num_layers: 2");  // unterminated
  EXPECT_HAS(e, "cfg.pbtxt:1:");
}

// One violated rule per entry: the config text and the exact line of the error it yields.
struct Rule {
  std::string text;
  std::string expect;
};

TEST(ConfigTest, EachValidationRuleNamesFileLineFieldAndValue) {
  const std::vector<Rule> rules = {
      {"model {\n num_layers: 0\n}", "cfg.pbtxt:2: model.num_layers = 0: must be positive"},
      {"model {\n hidden_size: -64\n}", "cfg.pbtxt:2: model.hidden_size = -64: must be positive"},
      {"model {\n num_heads: 0\n}", "cfg.pbtxt:2: model.num_heads = 0: must be positive"},
      {"model {\n ffn_hidden_size: -1\n}",
       "cfg.pbtxt:2: model.ffn_hidden_size = -1: must be positive"},
      {"model {\n seq_len: 0\n}", "cfg.pbtxt:2: model.seq_len = 0: must be positive"},
      {"model {\n seq_len: 100000\n}", "cfg.pbtxt:2: model.seq_len = 100000: must be at most"},
      {"model {\n vocab_size: -3\n}", "cfg.pbtxt:2: model.vocab_size = -3: must be positive"},
      {"model {\n vocab_size: 70000\n}", "cfg.pbtxt:2: model.vocab_size = 70000: must be at most"},
      {"model {\n init_std: -0.5\n}", "cfg.pbtxt:2: model.init_std = -0.5: must be >= 0"},
      {"model {\n plugin: \"\"\n}", "cfg.pbtxt:2: model.plugin = \"\": must name"},
      {"model {\n hidden_size: 64\n num_heads: 5\n}",
       "cfg.pbtxt:3: model.num_heads = 5: must divide model.hidden_size = 64"},
      {"model {\n vocab_size: 300\n padded_vocab_size: 256\n}",
       "cfg.pbtxt:3: model.padded_vocab_size = 256: must be >= model.vocab_size = 300"},
      {"parallel {\n tp: 0\n}", "cfg.pbtxt:2: parallel.tp = 0: must be >= 1"},
      {"parallel {\n pp: -1\n}", "cfg.pbtxt:2: parallel.pp = -1: must be >= 1"},
      {"parallel {\n dp: 0\n}", "cfg.pbtxt:2: parallel.dp = 0: must be >= 1"},
      {"model { num_heads: 4 hidden_size: 96 padded_vocab_size: 384 }\nparallel {\n tp: 3\n}",
       "cfg.pbtxt:3: parallel.tp = 3: must divide model.num_heads = 4"},
      {"model { num_heads: 6 hidden_size: 96 }\nparallel {\n tp: 3\n}",
       "cfg.pbtxt:3: parallel.tp = 3: must divide model.padded_vocab_size = 256"},
      {"model { num_heads: 4 padded_vocab_size: 512\n ffn_hidden_size: 258 }\nparallel { tp: 4 }",
       "cfg.pbtxt:3: parallel.tp = 4: must divide model.ffn_hidden_size = 258"},
      {"model { num_layers: 2 }\nparallel {\n pp: 3\n}",
       "cfg.pbtxt:3: parallel.pp = 3: must be <= model.num_layers = 2"},
      {"model { num_layers: 4 }\nparallel {\n pp: 2\n stage_layers: [1, 1, 2]\n}",
       "cfg.pbtxt:4: parallel.stage_layers = [1,1,2]: must have one entry per stage, "
       "parallel.pp = 2"},
      {"model { num_layers: 4 }\nparallel {\n pp: 2\n stage_layers: [4, 0]\n}",
       "cfg.pbtxt:4: parallel.stage_layers = [4,0]: every stage needs at least one layer"},
      {"model { num_layers: 4 }\nparallel {\n pp: 2\n stage_layers: [1, 2]\n}",
       "cfg.pbtxt:4: parallel.stage_layers = [1,2]: must sum to model.num_layers = 4"},
      {"parallel {\n bucket_mb: 0\n}", "cfg.pbtxt:2: parallel.bucket_mb = 0: must be positive"},
      {"train {\n micro_batch_size: 0\n}", "cfg.pbtxt:2: train.micro_batch_size = 0: must be >= 1"},
      {"train {\n global_batch_size: 0\n}",
       "cfg.pbtxt:2: train.global_batch_size = 0: must be >= 1"},
      {"parallel { dp: 2 }\ntrain {\n micro_batch_size: 4\n global_batch_size: 12\n}",
       "cfg.pbtxt:4: train.global_batch_size = 12: must be a multiple of "
       "train.micro_batch_size · parallel.dp = 4 · 2 = 8"},
      {"train {\n steps: -1\n}", "cfg.pbtxt:2: train.steps = -1: must be >= 0"},
      {"train {\n log_every: 0\n}", "cfg.pbtxt:2: train.log_every = 0: must be >= 1"},
      {"train {\n eval_every: -1\n}", "cfg.pbtxt:2: train.eval_every = -1: must be >= 0"},
      {"train {\n eval_batches: 0\n}", "cfg.pbtxt:2: train.eval_batches = 0: must be >= 1"},
      {"train { eval_every: 5 }\ndata {\n val_files: \"\"\n}",
       "cfg.pbtxt:3: data.val_files = \"\": must name the validation shards"},
      {"optim {\n lr: 0\n}", "cfg.pbtxt:2: optim.lr = 0: must be positive"},
      {"optim {\n lr: -0.001\n}", "cfg.pbtxt:2: optim.lr = -0.001: must be positive"},
      {"optim {\n beta1: 1\n}", "cfg.pbtxt:2: optim.beta1 = 1: must be in [0, 1)"},
      {"optim {\n beta2: -0.5\n}", "cfg.pbtxt:2: optim.beta2 = -0.5: must be in [0, 1)"},
      {"optim {\n eps: 0\n}", "cfg.pbtxt:2: optim.eps = 0: must be positive"},
      {"optim {\n warmup_steps: -5\n}", "cfg.pbtxt:2: optim.warmup_steps = -5: must be >= 0"},
      {"optim {\n min_lr_ratio: 1.5\n}",
       "cfg.pbtxt:2: optim.min_lr_ratio = 1.5: must be in [0, 1]"},
      {"optim {\n weight_decay: -0.1\n}", "cfg.pbtxt:2: optim.weight_decay = -0.1: must be >= 0"},
      {"optim {\n grad_clip: -1\n}", "cfg.pbtxt:2: optim.grad_clip = -1: must be >= 0"},
      {"data {\n train_files: \"\"\n}", "cfg.pbtxt:2: data.train_files = \"\": must name"},
      {"checkpoint {\n persistent_every_steps: -1\n}",
       "cfg.pbtxt:2: checkpoint.persistent_every_steps = -1: must be >= 0"},
      {"checkpoint {\n persistent_every_steps: 10\n dir: \"\"\n}",
       "cfg.pbtxt:3: checkpoint.dir = \"\": must be set"},
      {"runtime {\n device: cpu\n precision: bf16\n}",
       "cfg.pbtxt:3: runtime.precision = bf16: needs runtime.device = cuda, not cpu"},
      {"runtime {\n threads: -2\n}", "cfg.pbtxt:2: runtime.threads = -2: must be >= 0"},
      {"runtime {\n threads: 100000\n}",
       "cfg.pbtxt:2: runtime.threads = 100000: must be at most 1024"},
  };
  for (const auto& r : rules) {
    std::string e = error_of(r.text);
    EXPECT_HAS(e, r.expect);
    // The valid neighbours of a rule don't fire: one violation, one line.
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

// Every time field is bounded to what can work (issue 18, item 3): below a few of the 200 ms
// report periods a healthy job would be declared lost or hung, and beyond a day is "never".
TEST(ConfigTest, TimeFieldsAreBoundedWithTheReason) {
  const std::vector<Rule> rules = {
      {"detect {\n slot_timeout_ms: 0\n}",
       "cfg.pbtxt:2: detect.slot_timeout_ms = 0: must be >= 1000 (agents send a heartbeat every "
       "200 ms: a few late ones must not lose a healthy slot)"},
      {"detect {\n slot_timeout_ms: 80\n}", "detect.slot_timeout_ms = 80: must be >= 1000"},
      {"detect {\n slot_timeout_ms: -5\n}", "detect.slot_timeout_ms = -5: must be >= 1000"},
      {"detect {\n slot_timeout_ms: 2000000000\n}",
       "cfg.pbtxt:2: detect.slot_timeout_ms = 2000000000: must be at most 86400000 (one day)"},
      {"detect {\n controller_timeout_ms: 300\n}",
       "cfg.pbtxt:2: detect.controller_timeout_ms = 300: must be >= 1000 (the controller answers "
       "a heartbeat every 200 ms"},
      {"detect {\n liveness_timeout_ms: 400\n}",
       "cfg.pbtxt:2: detect.liveness_timeout_ms = 400: must be >= 600 (workers report every "
       "200 ms"},
      {"detect {\n hang_grace_ms: -1\n}",
       "cfg.pbtxt:2: detect.hang_grace_ms = -1: must be 0 (off) or >= 600 (the controller sees "
       "the step count through reports every 200 ms"},
      {"detect {\n hang_grace_ms: 50\n}", "detect.hang_grace_ms = 50: must be 0 (off) or >= 600"},
      {"parallel {\n comm_timeout_ms: 0\n}",
       "cfg.pbtxt:2: parallel.comm_timeout_ms = 0: must be >= 1000 (every collective waits"},
      {"parallel {\n comm_timeout_ms: 100000000\n}",
       "parallel.comm_timeout_ms = 100000000: must be at most 86400000 (one day)"},
      {"recovery {\n abort_timeout_ms: 10\n}",
       "cfg.pbtxt:2: recovery.abort_timeout_ms = 10: must be >= 500 (a survivor answers the "
       "abort"},
      {"recovery {\n diagnostics_timeout_ms: -1\n}",
       "cfg.pbtxt:2: recovery.diagnostics_timeout_ms = -1: must be 0 (off) or >= 4000 (three "
       "group tests"},
      {"recovery {\n diagnostics_timeout_ms: 500\n}",
       "recovery.diagnostics_timeout_ms = 500: must be 0 (off) or >= 4000"},
      {"sdc {\n replay_timeout_ms: 100\n}",
       "cfg.pbtxt:2: sdc.replay_timeout_ms = 100: must be >= 5000 (each phase starts a worker"},
      {"update {\n probation_steps: -1\n}",
       "cfg.pbtxt:2: update.probation_steps = -1: must be >= 0 (0: no probation)"},
      {"update {\n max_loss_jump: 0\n}", "cfg.pbtxt:2: update.max_loss_jump = 0: must be positive"},
  };
  for (const auto& r : rules) {
    std::string e = error_of(r.text);
    EXPECT_HAS(e, r.expect);
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // The bounds themselves, and the values 0 switches off, are accepted.
  EXPECT_NO_THROW(parse_config_text(
      "detect { slot_timeout_ms: 1000 controller_timeout_ms: 1000 liveness_timeout_ms: 600 "
      "hang_grace_ms: 0 }\nparallel { comm_timeout_ms: 86400000 }\nrecovery { "
      "abort_timeout_ms: 500 diagnostics_timeout_ms: 0 }\nsdc { replay_timeout_ms: 5000 }\n"
      "update { probation_steps: 0 }",
      "x", {}));
  EXPECT_NO_THROW(
      parse_config_text("detect { hang_grace_ms: 600 }\n"
                        "recovery { diagnostics_timeout_ms: 4000 }",
                        "x", {}));
  // Through --set, as the issue's user typed it.
  EXPECT_HAS(error_of("", {"detect.slot_timeout_ms=0"}),
             "cfg.pbtxt (--set detect.slot_timeout_ms=0): detect.slot_timeout_ms = 0: must be >= "
             "1000");
}

// Settings the chosen recovery.mode never reads are refused, saying why (issue 18, item 8).
TEST(ConfigTest, RecoverySettingsTheModeIgnoresAreRefused) {
  const std::vector<Rule> rules = {
      {"recovery { mode: restart_all }\ndetect {\n on_slot_loss: wait\n}",
       "cfg.pbtxt:3: detect.on_slot_loss = wait: needs recovery.mode = in_place, not "
       "restart_all (restart_all replaces a lost slot by a standby; to wait for one, set "
       "recovery.on_no_standby = wait)"},
      {"detect {\n on_slot_loss: wait\n}",
       "cfg.pbtxt:2: detect.on_slot_loss = wait: needs recovery.mode = in_place, not hot_swap"},
      {"recovery {\n mode: in_place\n evict: dp_replica\n}",
       "cfg.pbtxt:3: recovery.evict = dp_replica: needs recovery.mode = hot_swap, not in_place "
       "(in_place never evicts a slot)"},
      {"recovery {\n mode: in_place\n evict: pp_group\n}",
       "cfg.pbtxt:3: recovery.evict = pp_group: needs recovery.mode = hot_swap, not in_place"},
      {"recovery {\n mode: restart_all\n evict: pp_group\n}",
       "cfg.pbtxt:3: recovery.evict = pp_group: needs recovery.mode = hot_swap, not restart_all "
       "(restart_all restarts every rank; it evicts only lost slots)"},
      {"recovery {\n mode: in_place\n on_no_standby: wait\n}",
       "cfg.pbtxt:3: recovery.on_no_standby = wait: needs recovery.mode = hot_swap or "
       "restart_all, not in_place (in_place never evicts a slot, so never looks for a standby; "
       "a lost slot follows detect.on_slot_loss)"},
      {"recovery {\n mode: restart_all\n on_no_standby: shrink_dp\n}",
       "cfg.pbtxt:3: recovery.on_no_standby = shrink_dp: needs recovery.mode = hot_swap, not "
       "restart_all"},
      {"recovery {\n mode: restart_all\n on_no_standby: reshape\n}",
       "cfg.pbtxt:3: recovery.on_no_standby = reshape: needs recovery.mode = hot_swap, not "
       "restart_all"},
      {"recovery {\n on_no_standby: reshape\n}\ncheckpoint { snapshot_every_step: false }",
       "cfg.pbtxt:2: recovery.on_no_standby = reshape: needs checkpoint.snapshot_every_step = "
       "true"},
  };
  for (const auto& r : rules) {
    std::string e = error_of(r.text);
    EXPECT_HAS(e, r.expect);
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // The combinations that mean something pass.
  for (const char* ok :
       {"recovery { mode: in_place } detect { on_slot_loss: wait }",
        "recovery { mode: hot_swap evict: dp_replica on_no_standby: shrink_dp }",
        "recovery { mode: hot_swap on_no_standby: wait }",
        "recovery { mode: hot_swap on_no_standby: reshape }",
        "recovery { mode: restart_all on_no_standby: wait }", "recovery { mode: in_place }"})
    EXPECT_NO_THROW(parse_config_text(ok, "x", {})) << ok;
}

TEST(ConfigTest, ValidCornerCasesPass) {
  EXPECT_NO_THROW(parse_config_text("runtime { device: cuda precision: bf16 }", "x", {}));
  EXPECT_NO_THROW(parse_config_text(
      "model { num_layers: 3 } parallel { pp: 2 stage_layers: [2, 1] }", "x", {}));
  EXPECT_NO_THROW(parse_config_text("optim { beta1: 0 min_lr_ratio: 1 grad_clip: 0 }", "x", {}));
  EXPECT_NO_THROW(parse_config_text("train { steps: 0 }", "x", {}));
}

TEST(ConfigTest, ViolationsAreAllReported) {
  std::string e = error_of("optim {\n lr: 0\n eps: 0\n}");
  EXPECT_HAS(e, "cfg.pbtxt:2: optim.lr = 0");
  EXPECT_HAS(e, "cfg.pbtxt:3: optim.eps = 0");
}

TEST(ConfigTest, ErrorsSayWhereAValueCameFrom) {
  // From --set: the assignment is quoted instead of a line.
  std::string e = error_of("model {\n num_heads: 4\n}", {"model.num_heads=5"});
  EXPECT_HAS(e,
             "cfg.pbtxt (--set model.num_heads=5): model.num_heads = 5: must divide "
             "model.hidden_size = 64");
  // A default blamed because another field changed.
  e = error_of("model {\n hidden_size: 66\n}");
  EXPECT_HAS(e, "cfg.pbtxt (default): model.num_heads = 4: must divide model.hidden_size = 66");
  // A --set that assigned a whole message is traced per field.
  e = error_of("model {\n num_heads: 4\n}", {"model={num_heads: 5}"});
  EXPECT_HAS(e, "cfg.pbtxt (--set model={num_heads: 5}): model.num_heads = 5");
  // validate_config alone, without an origin.
  config::JobConfig c;
  c.mutable_optim()->set_lr(-1);
  try {
    validate_config(c);
    FAIL();
  } catch (const InputError& err) {
    EXPECT_HAS(err.what(), "config (default): optim.lr = -1: must be positive");
  }
}

TEST(ConfigTest, SetOverrides) {
  config::JobConfig c = parse_config_text(
      "model { num_layers: 4 num_heads: 4 }\noptim { schedule: cosine }", "cfg.pbtxt",
      {"model.num_heads=8", "parallel.pp=2", "parallel.stage_layers=3,1", "optim.schedule=constant",
       "data.train_files=/data/fineweb/train_*.bin", "parallel.zero1=true", "optim.lr=3e-4",
       "train.seed=18446744073709551615", "model.num_heads = 16"});
  EXPECT_EQ(c.model().num_heads(), 16);  // the last --set wins
  EXPECT_EQ(c.parallel().pp(), 2);
  ASSERT_EQ(c.parallel().stage_layers_size(), 2);
  EXPECT_EQ(c.parallel().stage_layers(0), 3);
  EXPECT_EQ(c.parallel().stage_layers(1), 1);
  EXPECT_EQ(c.optim().schedule(), config::OptimConfig::constant);
  EXPECT_EQ(c.data().train_files(), "/data/fineweb/train_*.bin");
  EXPECT_TRUE(c.parallel().zero1());
  EXPECT_FLOAT_EQ(c.optim().lr(), 3e-4f);
  EXPECT_EQ(c.train().seed(), 18446744073709551615ull);
  EXPECT_EQ(c.model().num_layers(), 4);  // untouched fields keep the file's value

  // A repeated field is replaced, not appended to, and an empty value clears it.
  c = parse_config_text("model { num_layers: 4 } parallel { pp: 2 stage_layers: [2, 2] }", "x",
                        {"parallel.stage_layers=1,3"});
  EXPECT_EQ(c.parallel().stage_layers_size(), 2);
  EXPECT_EQ(c.parallel().stage_layers(0), 1);
  c = parse_config_text("model { num_layers: 4 } parallel { pp: 2 stage_layers: [2, 2] }", "x",
                        {"parallel.stage_layers="});
  EXPECT_EQ(c.parallel().stage_layers_size(), 0);
  // The list as text format writes it, in brackets, too (not "Expected integer, got: [").
  c = parse_config_text("model { num_layers: 4 } parallel { pp: 2 }", "x",
                        {"parallel.stage_layers=[3, 1]"});
  ASSERT_EQ(c.parallel().stage_layers_size(), 2);
  EXPECT_EQ(c.parallel().stage_layers(0), 3);
  EXPECT_EQ(c.parallel().stage_layers(1), 1);
  c = parse_config_text("model { num_layers: 4 } parallel { pp: 2 stage_layers: [2, 2] }", "x",
                        {"parallel.stage_layers=[]"});
  EXPECT_EQ(c.parallel().stage_layers_size(), 0);

  // A message value merges into what is there.
  c = parse_config_text("model { num_layers: 4 }", "x", {"model={hidden_size: 128 num_heads: 8}"});
  EXPECT_EQ(c.model().num_layers(), 4);
  EXPECT_EQ(c.model().hidden_size(), 128);
  EXPECT_EQ(c.model().ffn_hidden_size(), 512);  // derived after the overrides

  // apply_override alone reports what it assigned.
  config::JobConfig d;
  EXPECT_EQ(apply_override(&d, "runtime.device=cuda"), std::vector<std::string>{"runtime.device"});
  EXPECT_EQ(d.runtime().device(), config::RuntimeConfig::cuda);
  EXPECT_EQ(apply_override(&d, "deterministic=false"), std::vector<std::string>{"deterministic"});
  EXPECT_FALSE(d.deterministic());
  apply_override(&d, R"(model.plugin="lib my\"model.so")");  // quoted: text-format escapes
  EXPECT_EQ(d.model().plugin(), "lib my\"model.so");
  // A failed assignment changes nothing, not even the part of a list before the bad item.
  d.mutable_parallel()->add_stage_layers(5);
  EXPECT_THROW(apply_override(&d, "parallel.stage_layers=1,x"), InputError);
  ASSERT_EQ(d.parallel().stage_layers_size(), 1);
  EXPECT_EQ(d.parallel().stage_layers(0), 5);
}

TEST(ConfigTest, BadSetIsNamed) {
  auto set_error = [](const std::string& assignment) {
    config::JobConfig c;
    try {
      apply_override(&c, assignment);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no InputError for --set " << assignment;
    return std::string();
  };
  std::string e = set_error("model.num_head=5");
  EXPECT_HAS(e, "--set model.num_head=5");
  EXPECT_HAS(e, "unknown field model.num_head");
  e = set_error("modle.num_heads=5");
  EXPECT_HAS(e, "unknown field modle ");
  e = set_error("model.num_layers.x=5");
  EXPECT_HAS(e, "model.num_layers has no fields");
  e = set_error("model.num_heads=abc");
  EXPECT_HAS(e, "--set model.num_heads=abc: model.num_heads = abc:");
  e = set_error("model.num_heads=99999999999");
  EXPECT_HAS(e, "model.num_heads = 99999999999");
  e = set_error("optim.schedule=cosin");
  EXPECT_HAS(e, "optim.schedule = cosin");
  EXPECT_HAS(e, "cosin");
  e = set_error("parallel.stage_layers=1,x");
  EXPECT_HAS(e, "parallel.stage_layers = x");
  e = set_error("model.num_heads");
  EXPECT_HAS(e, "--set model.num_heads: expected path.to.field=value");
  e = set_error("=5");
  EXPECT_HAS(e, "empty field path");

  // Through parse_config_text as well.
  e = error_of("", {"train.stepz=3"});
  EXPECT_HAS(e, "--set train.stepz=3: unknown field train.stepz");
}

TEST(ConfigTest, TextRoundTripsWithEveryField) {
  config::JobConfig c = parse_config_text("model { num_layers: 3 } parallel { pp: 3 }", "x",
                                          {"parallel.stage_layers=1,1,1"});
  std::string text = config_to_text(c);
  // Defaults are written out, so a log shows exactly what ran.
  EXPECT_HAS(text, "num_heads: 4");
  EXPECT_HAS(text, "schedule: cosine");
  EXPECT_HAS(text, "stage_layers: [1, 1, 1]");
  EXPECT_HAS(text, "deterministic: true");
  config::JobConfig back = parse_config_text(text, "printed", {});
  EXPECT_EQ(config_to_text(back), text);
  EXPECT_EQ(back.model().num_layers(), 3);
  EXPECT_EQ(back.parallel().stage_layers_size(), 3);
}

}  // namespace
}  // namespace keel
