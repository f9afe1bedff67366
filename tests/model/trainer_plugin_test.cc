// Replacing the model's code under a live state (the hot update's foundation): a private copy
// of a plugin is a distinct instance of the same build; the Trainer trains on with it exactly
// as before; a plugin that describes other parameters is refused, naming the first
// difference, and the Trainer goes on with its own.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "model/data_loader.h"
#include "model/plugin_loader.h"
#include "model/token_shards.h"
#include "model/trainer.h"
#include "parallel/hash_store.h"
#include "proto/config_loader.h"
#include "test_paths.h"

namespace keel::test {
namespace {

config::JobConfig job(const std::string& dir) {
  std::vector<uint16_t> tokens(1 << 16);
  std::mt19937 gen(5);
  for (auto& t : tokens) t = uint16_t(gen() % 256);
  write_token_shard(dir + "/train_000000.bin", tokens);
  return parse_config_text("model { plugin: \"" + bin_dir() +
                               "/libkeel_gpt.so\" num_layers: 2 hidden_size: 32 "
                               "num_heads: 4 seq_len: 16 }\n"
                               "train { micro_batch_size: 2 global_batch_size: 4 steps: 6 }\n"
                               "runtime { threads: 1 }\n"
                               "data { train_files: \"" +
                               dir + "/train_*.bin\" }\n",
                           "plugin-test", {});
}

// One rank: `steps` steps, `swap(trainer, k)` called before step k; the state's bytes after.
template <typename Swap>
std::vector<char> train(const config::JobConfig& cfg, int steps, Swap swap) {
  auto backend = make_cpu_backend(1);
  auto plugin = Plugin::load(cfg.model().plugin());
  DataLoader data = DataLoader::from_config(cfg);
  const Topology topo(1, 1, 1);
  auto state = make_train_state(cfg, backend.get(), *plugin, topo, 0);
  ProcessGroups groups = make_process_groups(topo, 0, std::make_shared<HashStore>(), {});
  Trainer trainer(cfg, backend.get(), plugin, topo, 0, state.get(), &groups, &data);
  trainer.init_params();
  for (int k = 0; k < steps; ++k) {
    swap(trainer, k);
    trainer.step();
  }
  std::vector<char> out;
  for (const StateSpan& sp : state->spans()) {
    const size_t at = out.size();
    out.resize(at + sp.bytes());
    backend->copy_to_host(out.data() + at, sp.data, sp.bytes());
  }
  return out;
}

TEST(TrainerPlugin, APrivateCopyIsADistinctInstanceOfTheSameBuild) {
  const std::string dir = temp_dir("plugin-copy");
  setenv("TMPDIR", dir.c_str(), 1);
  auto a = Plugin::load(bin_dir() + "/libkeel_gpt.so");
  auto b = Plugin::load_copy(bin_dir() + "/libkeel_gpt.so");
  unsetenv("TMPDIR");
  EXPECT_NE(&a->table(), &b->table());  // two loaded objects side by side
  EXPECT_EQ(a->hash(), b->hash());
  EXPECT_EQ(a->hash().size(), 64u);  // SHA-256
  EXPECT_EQ(b->path(), a->path());  // named by the file it came from
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().rfind("keel-plugin-", 0), std::string::npos)
        << "private copy left behind: " << e.path();
}

TEST(TrainerPlugin, AReplacedPluginTrainsOnBitwiseAsBefore) {
  const config::JobConfig cfg = job(temp_dir("plugin-swap"));
  const std::vector<char> plain = train(cfg, 6, [](Trainer&, int) {});
  std::shared_ptr<Plugin> before;
  const std::vector<char> swapped = train(cfg, 6, [&](Trainer& t, int k) {
    if (k != 3) return;
    before = t.plugin();
    t.replace_plugin(Plugin::load_copy(cfg.model().plugin()));
    EXPECT_NE(t.plugin().get(), before.get());
  });
  EXPECT_TRUE(swapped == plain);
}

TEST(TrainerPlugin, APluginWithOtherParametersIsRefusedAndTheOldOneTrainsOn) {
  const config::JobConfig cfg = job(temp_dir("plugin-refuse"));
  const std::vector<char> plain = train(cfg, 4, [](Trainer&, int) {});
  std::string why;
  const std::vector<char> after = train(cfg, 4, [&](Trainer& t, int k) {
    if (k != 2) return;
    const auto own = t.plugin();
    // A valid plugin of one parameter "w" [5, 4] (one of the loader tests' defects, harmless
    // at tp = 1): not the GPT's table.
    try {
      t.replace_plugin(Plugin::load_copy(bin_dir() + "/libkeel_broken_bad_split.so"));
    } catch (const InputError& e) {
      why = e.what();
    }
    EXPECT_EQ(t.plugin().get(), own.get());
  });
  EXPECT_NE(why.find("does not fit the running state: parameter 0: 'wte' in the running state, "
                     "'w' in the new plugin"),
            std::string::npos)
      << why;
  EXPECT_TRUE(after == plain);
}

keel_param_desc desc(const char* name, std::vector<int64_t> shape, int tp_dim = -1) {
  keel_param_desc d{};
  std::snprintf(d.name, sizeof(d.name), "%s", name);
  d.ndim = int32_t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  d.tp_dim = tp_dim;
  d.tp_blocks = 1;
  return d;
}

TEST(TrainerPlugin, TheFirstDifferenceIsNamed) {
  const std::vector<keel_param_desc> a = {desc("wte", {64, 8}, 0), desc("ln.w", {8})};
  EXPECT_EQ(first_param_difference(a, a), "");
  auto b = a;
  b[0].init = KEEL_INIT_ONES;  // inits do not matter to a running state
  EXPECT_EQ(first_param_difference(a, b), "");
  b[1].shape[0] = 16;
  EXPECT_EQ(first_param_difference(a, b),
            "parameter 1: shape [8] in the running state, [16] in the new plugin ('ln.w')");
  b = a;
  b[0].tp_dim = -1;
  EXPECT_EQ(first_param_difference(a, b),
            "parameter 0: TP split (tp_dim, tp_blocks) (0, 1) in the running state, (-1, 1) in "
            "the new plugin ('wte')");
  b = a;
  b[1].flags = KEEL_PARAM_WEIGHT_DECAY;
  EXPECT_EQ(first_param_difference(a, b),
            "parameter 1: flags 0 in the running state, 1 in the new plugin ('ln.w')");
  b = a;
  b.push_back(desc("head", {64, 8}));
  EXPECT_EQ(first_param_difference(a, b),
            "2 parameters in the running state, 3 in the new plugin (first extra: 'head')");
}

}  // namespace
}  // namespace keel::test
