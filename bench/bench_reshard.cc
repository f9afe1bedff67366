// keel-bench reshard: how long a persistent checkpoint takes to load into another layout than
// the one that wrote it, against the same layout (issue 30). The GPT plugin's state (L28 d512
// T256 V256: parameters + AdamW m + v, ~1 GB; or the medium L6 d512, 230 MB) is saved at
// TP2×PP2×DP2 as a job saves it (a rank file each and a manifest), then loaded by every rank
// of each target layout in turn, as keel-worker --resume does (ckpt/checkpoint_reshard.h):
//   verify   find_resume_point: every file read and checked against the manifest (each rank
//            of a resuming job does it once);
//   slowest  the slowest rank's load_state (a job waits for it);
//   ranks    all ranks' loads one after another (the total bytes read on one machine).
// The same layout reads each rank's own file whole; another one reads only the byte ranges
// each new rank needs, from the page cache after the first pass (as on a machine that just
// wrote or verified the files). Seconds, best of --repeats; 1 GB = 1e9 bytes.
//
//   keel-bench reshard [--size 1g|medium] [--repeats 3] [--dir DIR]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bench/scenarios.h"
#include "ckpt/checkpoint_reshard.h"
#include "model/job_layout.h"
#include "model/trainer.h"
#include "parallel/hash_store.h"
#include "runtime/check.h"

namespace keel {
namespace bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct ReshardOptions {
  std::string size = "1g";
  int repeats = 3;
  std::string dir;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

config::JobConfig job(int layers, int tp, int pp, int dp) {
  config::JobConfig c;
  auto* m = c.mutable_model();
  m->set_plugin("libkeel_gpt.so");
  m->set_num_layers(layers);
  m->set_hidden_size(512);
  m->set_num_heads(8);
  m->set_seq_len(256);
  m->set_vocab_size(256);
  c.mutable_parallel()->set_tp(tp);
  c.mutable_parallel()->set_pp(pp);
  c.mutable_parallel()->set_dp(dp);
  return c;
}

// Saves every rank of `cfg`'s layout as step 100, rank 0 last (it seals the step once every
// other rank's part is in the store). Returns the bytes written.
uint64_t save(const std::string& dir, const config::JobConfig& cfg, const Plugin& plugin,
              Backend* backend) {
  const Topology topo(cfg.parallel().tp(), cfg.parallel().pp(), cfg.parallel().dp());
  auto store = std::make_shared<HashStore>();
  CheckpointLayout layout{.tp = topo.tp(), .pp = topo.pp(), .dp = topo.dp()};
  layout.plugin_name = plugin.name();
  layout.plugin_version = plugin.version();
  layout.model = describe_model(cfg);
  uint64_t bytes = 0;
  for (int r = topo.world_size() - 1; r >= 0; --r) {
    auto state = make_train_state(cfg, backend, plugin, topo, r);
    for (const StateSpan& s : state->spans())
      for (size_t i = 0; i < s.floats; ++i) s.data[i] = float((i * 2654435761u + r) % 1000) * 1e-3f;
    state->set_step(100);
    PersistentCheckpointer ck({.dir = dir, .rank = r, .layout = layout}, [&] { return store; });
    ck.save_async(*state);
    ck.wait();
    KEEL_CHECK(ck.failures() == 0, "rank ", r, "'s file was not written");
    bytes += state->bytes();
  }
  return bytes;
}

int reshard_main(const ReshardOptions& o) {
  const int layers = o.size == "1g" ? 28 : 6;
  const std::string dir =
      o.dir.empty() ? fs::temp_directory_path().string() + "/keel-bench-reshard" : o.dir;
  fs::remove_all(dir);
  auto backend = make_cpu_backend(1);
  const std::shared_ptr<Plugin> plugin = Plugin::load("libkeel_gpt.so");
  const config::JobConfig written = job(layers, 2, 2, 2);
  const auto t_save = Clock::now();
  const uint64_t bytes = save(dir, written, *plugin, backend.get());
  std::printf(
      "== reshard: GPT L%d d512, %.2f GB of state a replica (%.2f GB in 8 rank files) written "
      "at tp 2 pp 2 dp 2 in %.1f s; best of %d\n",
      layers, double(bytes) / 2e9, double(bytes) / 1e9, seconds_since(t_save), o.repeats);
  std::printf("%-22s %9s %11s %9s\n", "into", "verify s", "slowest s", "ranks s");
  for (auto [tp, pp, dp, zero1] :
       {std::tuple{2, 2, 2, false}, {1, 1, 1, false}, {1, 2, 4, true}, {4, 1, 2, false}}) {
    const config::JobConfig cfg = [&] {
      config::JobConfig c = job(layers, tp, pp, dp);
      c.mutable_parallel()->set_zero1(zero1);
      return c;
    }();
    const Topology topo(tp, pp, dp);
    double verify = 1e30, slowest = 1e30, all = 1e30;
    for (int rep = 0; rep < o.repeats; ++rep) {
      auto t = Clock::now();
      const ResumePoint p = find_resume_point(dir, {});
      verify = std::min(verify, seconds_since(t));
      double worst = 0, sum = 0;
      for (int r = 0; r < topo.world_size(); ++r) {
        auto state = make_train_state(cfg, backend.get(), *plugin, topo, r);
        t = Clock::now();
        load_state(p, *plugin, cfg, topo, r, *state);
        const double s = seconds_since(t);
        worst = std::max(worst, s);
        sum += s;
      }
      slowest = std::min(slowest, worst);
      all = std::min(all, sum);
    }
    const std::string name =
        detail::concat("tp ", tp, " pp ", pp, " dp ", dp, zero1 ? " zero1" : "",
                       tp == 2 && pp == 2 && dp == 2 ? " (same)" : "");
    std::printf("%-22s %9.3f %11.3f %9.3f\n", name.c_str(), verify, slowest, all);
  }
  fs::remove_all(dir);
  return 0;
}

}  // namespace

Command add_reshard_command(CLI::App& app) {
  auto o = std::make_shared<ReshardOptions>();
  CLI::App* sub = app.add_subcommand(
      "reshard", "loading a persistent checkpoint into another layout, against the same one");
  sub->add_option("--size", o->size, "the state: 1g (L28 d512, default) or medium (L6 d512)")
      ->option_text("SIZE")
      ->check(CLI::IsMember({"1g", "medium"}));
  sub->add_option("--repeats", o->repeats, "timed repeats of each, best of them (default 3)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxRepeats));
  sub->add_option("--dir", o->dir, "where the checkpoint is written (default: a temporary folder)")
      ->option_text("DIR");
  return {sub, [o] { return reshard_main(*o); }};
}

}  // namespace bench
}  // namespace keel
