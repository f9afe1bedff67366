// The memory estimate made before allocating: its parameter and activation counts agree with
// what the GPT plugin declares, and a job too large for the machine is refused with the
// estimate, what is available and where that came from.
#include "model/memory_estimate.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/job_layout.h"
#include "model/plugin_loader.h"
#include "parallel/topology.h"
#include "proto/config_loader.h"
#include "tests/test_expect.h"

namespace keel {
namespace {

config::JobConfig job(const std::vector<std::string>& sets) {
  return parse_config_text("", "job.pbtxt", sets);
}

// Parameters of one (tp, pp) coordinate as the plugin describes them.
double plugin_params(const Plugin& plugin, const config::JobConfig& cfg, Coord c) {
  keel_model_dims d = model_dims(cfg);
  keel_stage s = stage_of(cfg, c);
  int n = plugin.table().describe_params(&d, &s, nullptr, 0);
  std::vector<keel_param_desc> descs(static_cast<size_t>(n));
  plugin.table().describe_params(&d, &s, descs.data(), n);
  double total = 0;
  for (const auto& p : descs) {
    double numel = 1;
    for (int i = 0; i < p.ndim; ++i) numel *= double(p.shape[i]);
    total += p.tp_dim >= 0 ? numel / s.tp_size : numel;
  }
  return total;
}

TEST(MemoryEstimateTest, AgreesWithWhatTheGptPluginDeclares) {
  auto plugin = Plugin::load("libkeel_gpt.so");
  for (auto sets : std::vector<std::vector<std::string>>{
           {},
           {"parallel.tp=2", "parallel.pp=2", "model.num_layers=4", "train.global_batch_size=16"},
           {"parallel.tp=4", "parallel.pp=4", "model.num_layers=8", "model.seq_len=128"}}) {
    config::JobConfig cfg = job(sets);
    for (int pp = 0; pp < cfg.parallel().pp(); ++pp) {
      MemoryEstimate e = estimate_rank_memory(cfg, pp);
      Coord c{0, pp, 0};
      EXPECT_DOUBLE_EQ(e.params / 4, plugin_params(*plugin, cfg, c)) << sets.size() << " " << pp;
      EXPECT_EQ(e.grads, e.params);
      EXPECT_EQ(e.moments, 2 * e.params);
      // The plugin aligns every buffer to 64 floats; the estimate does not, so it may be a
      // little lower, never higher.
      keel_model_dims d = model_dims(cfg);
      keel_stage s = stage_of(cfg, c);
      const int B = cfg.train().micro_batch_size(), T = cfg.model().seq_len();
      double act = double(plugin->table().activation_floats(&d, &s, B, T));
      double per_micro = e.activations / e.in_flight / 4;
      EXPECT_GE(per_micro, act * 0.95) << pp;
      EXPECT_LE(per_micro, act * 1.2 + double(B) * T * d.hidden_size) << pp;
      double scratch = double(plugin->table().scratch_floats(&d, &s, B, T));
      EXPECT_GE(e.scratch / 4, scratch * 0.95) << pp;
    }
  }
}

TEST(MemoryEstimateTest, PipelineAndZeroShapeTheEstimate) {
  // 1F1B keeps pp − stage micro-batches in flight (at most the micro-batches of a step).
  config::JobConfig cfg = job({"parallel.pp=4", "model.num_layers=4", "train.micro_batch_size=1",
                               "train.global_batch_size=8"});
  EXPECT_EQ(estimate_rank_memory(cfg, 0).in_flight, 4);
  EXPECT_EQ(estimate_rank_memory(cfg, 3).in_flight, 1);
  // ZeRO-1 keeps a 1/dp shard of the moments.
  config::JobConfig dp = job({"parallel.dp=4", "train.global_batch_size=16"});
  config::JobConfig z = job({"parallel.dp=4", "train.global_batch_size=16", "parallel.zero1=true"});
  EXPECT_DOUBLE_EQ(estimate_rank_memory(z, 0).moments * 4, estimate_rank_memory(dp, 0).moments);
  // Snapshot slots of parameters and moments: two own, which on CPU hold the live state too;
  // a DP replica holds the backup, so nothing more. With ZeRO-1 two slots of a pushed backup.
  // The SDC checks (on by default in deterministic mode) add the verified slot, and where
  // backups are pushed its copy at the holder.
  MemoryEstimate e = estimate_rank_memory(dp, 0);
  EXPECT_EQ(e.verified_slots, 1);
  EXPECT_DOUBLE_EQ(e.snapshot, 3 * (e.params + e.moments));
  EXPECT_DOUBLE_EQ(e.host_bytes(false), e.device_bytes() + e.process + e.snapshot * 2 / 3);
  MemoryEstimate ez = estimate_rank_memory(z, 0);
  EXPECT_EQ(ez.verified_slots, 2);
  EXPECT_DOUBLE_EQ(ez.snapshot, 6 * (ez.params + ez.moments));
  EXPECT_DOUBLE_EQ(ez.host_bytes(false), ez.device_bytes() + ez.process + ez.snapshot * 5 / 6);
  config::JobConfig no_sdc = job({"parallel.dp=4", "train.global_batch_size=16",
                                  "sdc.check_every_steps=0"});
  MemoryEstimate en = estimate_rank_memory(no_sdc, 0);
  EXPECT_EQ(en.verified_slots, 0);
  EXPECT_DOUBLE_EQ(en.snapshot, 2 * (en.params + en.moments));
  config::JobConfig off = job({"checkpoint.snapshot_every_step=false"});
  EXPECT_EQ(estimate_rank_memory(off, 0).snapshot, 0);
}

TEST(MemoryEstimateTest, TooLargeJobIsRefusedWithTheNumbers) {
  AvailableMemory avail{8.0 * 1024 * 1024 * 1024, "MemAvailable in /proc/meminfo"};
  EXPECT_NO_THROW(check_memory_fits(job({}), 0, 1, avail));
  std::string e = test::input_error_of(
      [&] { check_memory_fits(job({"model.num_layers=100000"}), 0, 1, avail); });
  EXPECT_HAS(e, "the job does not fit in memory: its 1 rank(s) on this machine need an estimated ");
  EXPECT_HAS(e, "GiB of host memory, 8.0 GiB available (MemAvailable in /proc/meminfo)");
  EXPECT_HAS(e, "parameters 18.");  // 100000 layers of 49,984 floats
  EXPECT_HAS(e, "model.num_layers = 100000");
  // Many small ranks on one machine add up: each is a process.
  config::JobConfig wide = job({"parallel.dp=1000", "train.global_batch_size=4000"});
  e = test::input_error_of([&] { check_memory_fits(wide, 0, 1000, avail); });
  EXPECT_HAS(e, "its 1000 rank(s) on this machine");
  EXPECT_NO_THROW(check_memory_fits(wide, 0, 10, avail));
  // On CUDA only the host side (process, snapshot slots) is checked here.
  config::JobConfig cuda =
      job({"model.num_layers=2000", "model.hidden_size=1024", "model.num_heads=8",
           "runtime.device=cuda", "checkpoint.snapshot_every_step=false"});
  EXPECT_NO_THROW(check_memory_fits(cuda, 0, 1, avail));
  EXPECT_GT(estimate_rank_memory(cuda, 0).device_bytes(), avail.bytes);
  // Unknown availability refuses nothing.
  EXPECT_NO_THROW(check_memory_fits(job({"model.num_layers=100000"}), 0, 1, {-1, "unknown"}));
}

TEST(MemoryEstimateTest, AvailableHostMemoryIsRead) {
  AvailableMemory a = available_host_memory();
  EXPECT_GT(a.bytes, 0);
  EXPECT_FALSE(a.source.empty());
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(100), "100 bytes");
}

}  // namespace
}  // namespace keel
