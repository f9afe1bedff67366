// Persistent checkpoints with two ranks in two threads sharing a HashStore: a bitwise round
// trip; a truncated, corrupt or unsealed newest checkpoint is skipped by name for the one
// before; a layout or model mismatch is refused naming the fields; retention; a failed write
// is reported at once and leaves no partial step.
#include "ckpt/persistent_checkpoint.h"
#include "proto/store_keys.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "parallel/hash_store.h"
#include "tests/test_expect.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using test::input_error_of;

keel_param_desc desc(const char* name, std::vector<int64_t> shape) {
  keel_param_desc d{};
  std::strncpy(d.name, name, KEEL_PARAM_NAME_MAX - 1);
  d.ndim = int32_t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  d.tp_dim = -1;
  d.tp_blocks = 1;
  d.init = KEEL_INIT_ZEROS;
  return d;
}

std::vector<keel_param_desc> model(int width = 16) {
  return {desc("w", {8, width}), desc("b", {width})};
}

// A value for every state float that differs by rank, step, span and index.
float value(int rank, int64_t step, size_t span, size_t i) {
  uint32_t x = uint32_t(rank * 7919 + step * 104729) ^ uint32_t(span * 0x9E3779B9u) ^
               uint32_t(i * 0x85EBCA6Bu);
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  x ^= x >> 12;
  return float(x >> 8) / float(1 << 24) - 0.5f;
}

void fill(TrainState& s, int rank, int64_t step) {
  auto spans = s.spans();
  for (size_t k = 0; k < spans.size(); ++k)
    for (size_t i = 0; i < spans[k].floats; ++i) spans[k].data[i] = value(rank, step, k, i);
  s.set_step(step);
}

bool holds(TrainState& s, int rank, int64_t step) {
  auto spans = s.spans();
  for (size_t k = 0; k < spans.size(); ++k)
    for (size_t i = 0; i < spans[k].floats; ++i) {
      float want = value(rank, step, k, i);
      if (std::memcmp(&spans[k].data[i], &want, sizeof(float)) != 0) return false;
    }
  return s.step() == step;
}

CheckpointLayout two_ranks(const std::string& lineage = "") {
  CheckpointLayout l;
  l.dp = 2;
  l.plugin_name = "test";
  l.plugin_version = "1";
  l.lineage = lineage;
  return l;
}

// Ranks 0 and 1, each a thread with its own checkpointer, save every step of `steps`.
void save_steps(const std::string& dir, const std::vector<int64_t>& steps, int keep = 3,
                const std::string& lineage = "") {
  auto store = std::make_shared<HashStore>();
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto be = make_cpu_backend(1);
      TrainState state(be.get(), model(), 0, 1, 1, false);
      PersistentCheckpointer ck({.dir = dir,
                                 .rank = r,
                                 .layout = two_ranks(lineage),
                                 .keep = keep,
                                 .wait_timeout = std::chrono::seconds(20)},
                                [&] { return store; });
      for (int64_t s : steps) {
        fill(state, r, s);
        ck.save_async(state);
        fill(state, r, s + 1000);  // the next step changes the state at once
      }
      ck.wait();
    });
  }
  for (auto& t : ranks) t.join();
}

TEST(PersistentCheckpoint, RoundTripIsBitwise) {
  std::string dir = test::temp_dir("pckpt_roundtrip");
  save_steps(dir, {10});
  std::vector<std::string> skipped;
  ResumePoint p = find_resume_point(dir, two_ranks(), &skipped);
  EXPECT_TRUE(skipped.empty());
  EXPECT_EQ(p.step, 10);
  EXPECT_EQ(p.dir, dir + "/step_000010");
  EXPECT_EQ(p.manifest.rank_file_size(), 2);
  EXPECT_EQ(p.manifest.plugin_name(), "test");
  EXPECT_GT(p.manifest.written_at(), 0);
  auto be = make_cpu_backend(1);
  for (int r = 0; r < 2; ++r) {
    TrainState state(be.get(), model(), 0, 1, 1, false);
    load_rank(p, r, state);
    EXPECT_TRUE(holds(state, r, 10)) << "rank " << r;
  }
  // No temporary file is left behind.
  for (const auto& e : fs::directory_iterator(p.dir))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(PersistentCheckpoint, TruncatedOrCorruptNewestFallsBackToThePrevious) {
  std::string dir = test::temp_dir("pckpt_truncated");
  save_steps(dir, {10, 20, 30});
  fs::resize_file(dir + "/step_000030/rank_1.bin",
                  fs::file_size(dir + "/step_000030/rank_1.bin") - 8);
  {
    std::fstream f(dir + "/step_000020/rank_0.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  std::vector<std::string> skipped;
  ResumePoint p = find_resume_point(dir, two_ranks(), &skipped);
  EXPECT_EQ(p.step, 10);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_HAS(skipped[0], "step_000030/rank_1.bin: ");
  EXPECT_HAS(skipped[0], "(truncated)");
  EXPECT_EQ(skipped[1], "step_000020/rank_0.bin: checksum mismatch");
  auto be = make_cpu_backend(1);
  TrainState state(be.get(), model(), 0, 1, 1, false);
  load_rank(p, 1, state);
  EXPECT_TRUE(holds(state, 1, 10));
}

TEST(PersistentCheckpoint, MissingManifestIsIncomplete) {
  std::string dir = test::temp_dir("pckpt_incomplete");
  save_steps(dir, {10, 20});
  fs::remove(dir + "/step_000020/manifest.pb");
  std::vector<std::string> skipped;
  ResumePoint p = find_resume_point(dir, two_ranks(), &skipped);
  EXPECT_EQ(p.step, 10);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0], "step_000020: no manifest (incomplete)");

  fs::remove(dir + "/step_000010/manifest.pb");
  std::string msg = input_error_of([&] { find_resume_point(dir, two_ranks()); });
  EXPECT_HAS(msg, dir + ": no usable checkpoint");
  EXPECT_HAS(msg, "step_000010: no manifest (incomplete)");
  EXPECT_HAS(input_error_of([&] { find_resume_point(dir + "/nope", two_ranks()); }),
             dir + "/nope: no such checkpoint directory");
}

// Another layout is no refusal (the state is resharded on load, ckpt/checkpoint_reshard.h);
// another plugin version is.
TEST(PersistentCheckpoint, AnotherLayoutIsFoundAnotherPluginIsNot) {
  std::string dir = test::temp_dir("pckpt_layout");
  save_steps(dir, {10});
  CheckpointLayout other = two_ranks();
  other.tp = 2;
  other.dp = 1;
  EXPECT_EQ(find_resume_point(dir, other).step, 10);
  other.plugin_version = "2";
  std::string msg = input_error_of([&] { find_resume_point(dir, other); });
  EXPECT_HAS(msg, dir + "/step_000010: the checkpoint's model differs from this job's:");
  EXPECT_HAS(msg, "plugin_version = \"1\" (this job: \"2\")");

  // A rank state of another model is refused by its layout fingerprint.
  ResumePoint p = find_resume_point(dir, two_ranks());
  auto be = make_cpu_backend(1);
  TrainState wider(be.get(), model(32), 0, 1, 1, false);
  EXPECT_HAS(input_error_of([&] { load_rank(p, 0, wider); }), "layout_fingerprint = ");
  EXPECT_EQ(wider.step(), 0);
}

TEST(PersistentCheckpoint, KeepsTheNewestAndDropsFailedSaves) {
  std::string dir = test::temp_dir("pckpt_keep");
  fs::create_directories(dir + "/step_000000");  // an older save that never completed
  save_steps(dir, {1, 2, 3, 4}, /*keep=*/2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step_000003", "step_000004"}));
  EXPECT_EQ(find_resume_point(dir, two_ranks()).step, 4);
}

// Two runs sharing a directory: each finds only its own lineage's checkpoints, so a job never
// restores a newer checkpoint another run left there; an empty lineage (a user's --resume)
// takes the newest of any.
TEST(PersistentCheckpoint, OnlyTheJobsOwnLineageCounts) {
  std::string dir = test::temp_dir("pckpt_lineage");
  save_steps(dir, {4}, /*keep=*/0, "job-b");
  save_steps(dir, {8, 12}, /*keep=*/0, "job-a");
  std::vector<std::string> skipped;
  ResumePoint p = find_resume_point(dir, two_ranks("job-b"), &skipped);
  EXPECT_EQ(p.step, 4);
  EXPECT_EQ(p.manifest.lineage(), "job-b");
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_HAS(skipped[0],
             "step_000012: written by another run (lineage \"job-a\", this job's \"job-b\")");
  EXPECT_EQ(find_resume_point(dir, two_ranks("job-a")).step, 12);
  EXPECT_EQ(find_resume_point(dir, two_ranks()).step, 12);
  EXPECT_HAS(input_error_of([&] { find_resume_point(dir, two_ranks("job-c")); }),
             "written by another run");

  // Retention counts and removes only the run's own: job-b keeping 1 drops none of job-a's
  // newer checkpoints, nor its own step 4 for them.
  save_steps(dir, {5}, /*keep=*/1, "job-b");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step_000005", "step_000008", "step_000012"}));
}

// A write that fails is reported when it fails, naming its own step and path, through
// on_write_failed (never as an exception of a later call), and counted.
TEST(PersistentCheckpoint, WriterErrorsAreReportedWhenTheyHappen) {
  std::string dir = test::temp_dir("pckpt_error") + "/not_a_dir";
  std::ofstream(dir) << "a file where the checkpoint directory should be";
  CheckpointLayout one;
  auto store = std::make_shared<HashStore>();
  std::vector<CheckpointWriteFailure> failures;  // written by the writer thread, read after wait
  PersistentCheckpointer ck(
      {.dir = dir,
       .rank = 0,
       .layout = one,
       .on_write_failed = [&](const CheckpointWriteFailure& f) { failures.push_back(f); }},
      [&] { return store; });
  EXPECT_EQ(ck.last_outcome(), PersistentCheckpointer::Outcome::kNone);
  auto be = make_cpu_backend(1);
  TrainState state(be.get(), model(), 0, 1, 1, false);
  fill(state, 0, 5);
  ck.save_async(state);
  ck.wait();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].step, 5);
  EXPECT_EQ(failures[0].rank, 0);
  EXPECT_EQ(failures[0].path, dir + "/step_000005");
  EXPECT_HAS(failures[0].message(),
             "persistent checkpoint of step 5 not written: " + dir + "/step_000005: mkdir: ");
  EXPECT_EQ(ck.last_outcome(), PersistentCheckpointer::Outcome::kFailed);
  fill(state, 0, 6);
  EXPECT_NO_THROW(ck.save_async(state));
  EXPECT_NO_THROW(ck.wait());
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[1].step, 6);
  EXPECT_EQ(ck.failures(), 2);
}

// One rank cannot write its file: it says so in the store at once, so rank 0 neither waits
// for it nor seals the step, and removes the step's directory; the previous checkpoint stays
// and the next save, with room again, is whole.
TEST(PersistentCheckpoint, ARankThatCannotWriteLeavesNoPartialStep) {
  std::string dir = test::temp_dir("pckpt_rank_fails");
  save_steps(dir, {4});
  // Rank 1's file of step 8 cannot be created: a directory stands in its name.
  fs::create_directories(dir + "/step_000008/rank_1.bin.tmp/x");
  auto store = std::make_shared<HashStore>();
  std::vector<std::thread> ranks;
  std::vector<int> failed(2, 0);
  std::vector<PersistentCheckpointer::Outcome> outcome(2);
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto be = make_cpu_backend(1);
      TrainState state(be.get(), model(), 0, 1, 1, false);
      PersistentCheckpointer ck({.dir = dir,
                                 .rank = r,
                                 .layout = two_ranks(),
                                 // Only the store's word can end rank 0's wait in time.
                                 .wait_timeout = std::chrono::hours(2),
                                 .on_write_failed =
                                     [&, r](const CheckpointWriteFailure& f) {
                                       EXPECT_EQ(f.step, 8);
                                       EXPECT_EQ(f.path, dir + "/step_000008/rank_1.bin");
                                       ++failed[size_t(r)];
                                     }},
                                [&] { return store; });
      fill(state, r, 8);
      ck.save_async(state);
      ck.wait();
      outcome[size_t(r)] = ck.last_outcome();
    });
  }
  // Rank 0 learns of rank 1's failure from the store and does not wait out wait_timeout.
  test::expect_returns(
      [&] {
        for (auto& t : ranks) t.join();
      },
      "the ranks' saves");
  EXPECT_EQ(failed, (std::vector<int>{0, 1}));
  EXPECT_EQ(outcome[1], PersistentCheckpointer::Outcome::kFailed);
  EXPECT_FALSE(fs::exists(dir + "/step_000008"));
  EXPECT_EQ(find_resume_point(dir, two_ranks()).step, 4);
  save_steps(dir, {12});
  EXPECT_EQ(find_resume_point(dir, two_ranks()).step, 12);
}

// A rank that dies while saving never publishes its part: rank 0 must not hold the training up
// waiting for it (it was a wait of wait_timeout in the next save_async, long enough for the
// hang rules to take rank 0 for hung). Rank 0 seals on a thread of its own, so the next save
// goes on at once; the old step is given up at the job's end (abandon_unsealed), or once a
// newer step is sealed.
TEST(PersistentCheckpoint, APartThatNeverComesDoesNotHoldTheNextSaveUp) {
  std::string dir = test::temp_dir("pckpt_dead_rank");
  auto store = std::make_shared<HashStore>();
  auto be = make_cpu_backend(1);
  TrainState state(be.get(), model(), 0, 1, 1, false);
  PersistentCheckpointer rank0(
      // A wait for the missing part would last hours: only not waiting returns in time.
      {.dir = dir, .rank = 0, .layout = two_ranks(), .wait_timeout = std::chrono::hours(2)},
      [&] { return store; });
  fill(state, 0, 4);
  rank0.save_async(state);  // rank 1's part of step 4 never comes: it died
  fill(state, 0, 8);
  test::expect_returns([&] { rank0.save_async(state); }, "the save after an unsealed step");
  EXPECT_FALSE(fs::exists(dir + "/step_000004/manifest.pb"));  // still waiting, not sealed
  // Rank 1 (restarted) could not write step 8 either: its part says so (ok false).
  set_message(*store, keys::checkpoint_part_key(8, 1), store::CheckpointPart());
  test::expect_returns(
      [&] {
        rank0.abandon_unsealed();
        rank0.wait();
      },
      "abandon_unsealed and wait");
  EXPECT_FALSE(fs::exists(dir + "/step_000004/manifest.pb"));
  EXPECT_FALSE(fs::exists(dir + "/step_000008/manifest.pb"));
  // A later step whose parts all come is sealed as before.
  fill(state, 0, 12);
  rank0.save_async(state);
  // Rank 1's real part: the same bytes a rank-1 checkpointer would publish.
  {
    TrainState other(be.get(), model(), 0, 1, 1, false);
    fill(other, 1, 12);
    PersistentCheckpointer rank1({.dir = dir, .rank = 1, .layout = two_ranks()},
                                 [&] { return store; });
    rank1.save_async(other);
    rank1.wait();
  }
  rank0.wait();
  EXPECT_TRUE(fs::exists(dir + "/step_000012/manifest.pb"));
  EXPECT_EQ(find_resume_point(dir, two_ranks()).step, 12);
}

// The manifest keeps the model's description: a job with another one is told the field and
// both values; a manifest without one (an older keel) is not compared.
TEST(PersistentCheckpoint, ModelMismatchNamesTheField) {
  std::string dir = test::temp_dir("pckpt_model");
  config::JobConfig written;
  written.mutable_model()->set_hidden_size(128);
  written.mutable_model()->set_ffn_hidden_size(512);
  {
    auto store = std::make_shared<HashStore>();
    CheckpointLayout one;
    one.model = describe_model(written);
    PersistentCheckpointer ck({.dir = dir, .rank = 0, .layout = one}, [&] { return store; });
    auto be = make_cpu_backend(1);
    TrainState state(be.get(), model(), 0, 1, 1, false);
    fill(state, 0, 3);
    ck.save_async(state);
    ck.wait();
    ASSERT_EQ(ck.failures(), 0);
  }
  config::JobConfig job = written;
  job.mutable_model()->set_hidden_size(64);
  job.mutable_parallel()->add_stage_layers(2);
  CheckpointLayout expected;
  expected.model = describe_model(job);
  const std::string msg = input_error_of([&] { find_resume_point(dir, expected); });
  EXPECT_HAS(msg, "model.hidden_size = 128 in the checkpoint, 64 in this job");
  // Stage layers are the layout, resharded on load: not compared.
  EXPECT_EQ(msg.find("parallel.stage_layers"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("model.ffn_hidden_size"), std::string::npos) << msg;
  expected.model = describe_model(written);
  EXPECT_EQ(find_resume_point(dir, expected).step, 3);
  expected.model.clear();  // not described by the job: not compared
  EXPECT_EQ(find_resume_point(dir, expected).step, 3);
}

}  // namespace
}  // namespace keel
