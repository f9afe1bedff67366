// keel-bench cpu: training throughput and MFU of the GPT plugin on this machine's CPU, for
// three model sizes, next to the measured SGEMM peak, with the share of step time per
// kernel; then (--layouts) the time split and bytes moved of each parallel layout of the
// tiny model on local processes. --speed prints the CPU-speed report instead (cpu_speed.h).
// Prints a table; record results in bench/RESULTS.md.
//
//   keel-bench cpu [--sizes tiny,small,medium] [--steps 5] [--threads N] [--layouts]
//   keel-bench cpu --speed [--threads 2]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "bench/bench_util.h"
#include "bench/cpu_speed.h"
#include "bench/scenarios.h"
#include "model/data_loader.h"
#include "model/job_layout.h"
#include "model/token_shards.h"
#include "model/trainer.h"
#include "parallel/hash_store.h"
#include "proto/config_loader.h"
#include "runtime/cpu/sgemm_peak.h"
#include "runtime/logging.h"
#include "runtime/profiling_backend.h"

namespace keel {
namespace {

using bench::exe_dir;
using bench::random_shards;

struct Size {
  const char* name;
  int layers, hidden, heads, seq_len, micro_batch;
};
const Size kSizes[] = {
    {"tiny", 2, 64, 4, 64, 8}, {"small", 4, 256, 4, 128, 8}, {"medium", 6, 512, 8, 256, 8}};

void bench_size(const Size& s, int steps, int threads, const std::string& shards, double peak) {
  std::ostringstream text;
  text << "model { plugin: \"" << exe_dir() << "/libkeel_gpt.so\" num_layers: " << s.layers
       << " hidden_size: " << s.hidden << " num_heads: " << s.heads << " seq_len: " << s.seq_len
       << " vocab_size: 256 }\n"
       << "train { micro_batch_size: " << s.micro_batch << " global_batch_size: " << s.micro_batch
       << " steps: " << steps + 1 << " }\n"
       << "data { train_files: \"" << shards << "\" }\n";
  config::JobConfig cfg = parse_config_text(text.str(), std::string("bench:") + s.name, {});
  auto profiler = std::make_shared<ProfilingBackend>(make_cpu_backend(threads));
  auto plugin = Plugin::load(cfg.model().plugin());
  DataLoader data = DataLoader::from_config(cfg);
  Topology topo(1, 1, 1);
  ProcessGroups groups = make_process_groups(topo, 0, std::make_shared<HashStore>(), {});
  auto state = make_train_state(cfg, profiler.get(), *plugin, topo, 0);
  Trainer trainer(cfg, profiler.get(), plugin, topo, 0, state.get(), &groups, &data);
  trainer.init_params();
  trainer.step();  // warm-up: page faults, OpenBLAS buffers
  profiler->reset();
  double wall = 0;
  int64_t tokens = 0;
  for (int i = 1; i <= steps; ++i) {
    StepStats st = trainer.step();
    wall += st.wall_s;
    tokens += st.tokens;
  }
  const double tok_s = double(tokens) / wall;
  const double fpt = trainer.model_flops_per_token();
  std::printf(
      "%-7s L=%d d=%-4d T=%-4d B=%d  params %9lld  %9.0f tok/s  %7.2f GFLOP/s  MFU %5.1f%%\n",
      s.name, s.layers, s.hidden, s.seq_len, s.micro_batch,
      static_cast<long long>(trainer.global_param_count()), tok_s, fpt * tok_s / 1e9,
      100 * fpt * tok_s / peak);
  double total = 0;
  for (const auto& [k, v] : profiler->seconds()) total += v;
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [k, v] : profiler->seconds()) rows.push_back({v, k});
  std::sort(rows.rbegin(), rows.rend());
  std::printf("        kernel share of step time:");
  for (const auto& [v, k] : rows)
    if (v / wall >= 0.005) std::printf(" %s %.1f%%", k.c_str(), 100 * v / wall);
  std::printf(" | outside kernels %.1f%%\n", 100 * std::max(0.0, 1 - total / wall));
}

void bench_layouts(const std::string& shards) {
  struct L {
    int tp, pp, dp;
  };
  const L layouts[] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 1}, {2, 2, 2}};
  std::string dir = std::filesystem::temp_directory_path() / "keel-bench-layouts";
  std::filesystem::create_directories(dir);
  std::string cfg = dir + "/tiny.pbtxt";
  std::ofstream(cfg) << "model { plugin: \"" << exe_dir()
                     << "/libkeel_gpt.so\" num_layers: 2 hidden_size: 64 num_heads: 4 "
                        "seq_len: 64 vocab_size: 256 }\n"
                     << "train { micro_batch_size: 2 global_batch_size: 16 steps: 11 }\n"
                     << "data { train_files: \"" << shards << "\" }\nruntime { threads: 1 }\n";
  std::printf(
      "\nlayouts of the tiny model (global batch 16, micro-batch 2), 10 timed steps, "
      "rank 0's time split and bytes it sent per step:\n");
  std::printf("%-14s %10s %9s %9s %9s %10s %10s %10s %10s\n", "layout", "tok/s", "compute", "comm",
              "bubble", "tp KB", "pp KB", "dp KB", "emb KB");
  double base = 0;
  for (const L& l : layouts) {
    const int world = l.tp * l.pp * l.dp;
    std::string report = dir + "/report.json";
    std::ostringstream cmd;
    cmd << exe_dir() << "/keel-worker --quiet --config " << cfg << " --report " << report
        << " --set parallel.tp=" << l.tp << " --set parallel.pp=" << l.pp
        << " --set parallel.dp=" << l.dp << (world > 1 ? " --nproc " + std::to_string(world) : "")
        << " > " << dir << "/run.log 2>&1";
    if (std::system(cmd.str().c_str()) != 0) {
      std::printf("tp%d pp%d dp%d: keel-worker failed (see %s/run.log)\n", l.tp, l.pp, l.dp,
                  dir.c_str());
      continue;
    }
    report::RunReport r;
    if (!bench::read_report(report, &r)) {
      std::printf("tp%d pp%d dp%d: keel-worker wrote no report\n", l.tp, l.pp, l.dp);
      continue;
    }
    const double tok = r.tokens_per_s(), c = r.compute_s(), m = r.comm_s(), b = r.bubble_s();
    double sum = std::max(1e-9, c + m + b);
    if (base == 0) base = tok;
    char name[32];
    std::snprintf(name, sizeof(name), "tp%d pp%d dp%d", l.tp, l.pp, l.dp);
    std::printf(
        "%-14s %10.0f %8.1f%% %8.1f%% %8.1f%% %10.1f %10.1f %10.1f %10.1f   (%.2fx of 1 rank)\n",
        name, tok, 100 * c / sum, 100 * m / sum, 100 * b / sum, r.bytes_tp() / 11 / 1024,
        r.bytes_pp() / 11 / 1024, r.bytes_dp() / 11 / 1024, r.bytes_emb() / 11 / 1024, tok / base);
  }
}

struct CpuOptions {
  std::vector<std::string> sizes = {"tiny", "small", "medium"};
  int steps = 5, threads = int(std::thread::hardware_concurrency());
  bool layouts = false, speed = false, sgemm_child = false;
};

int cpu_main(const CpuOptions& o) {
  try {
    if (o.sgemm_child) return bench::sgemm_child(o.threads);
    if (o.speed) return bench::cpu_speed_report(o.threads);
    std::string shards = random_shards(std::filesystem::temp_directory_path() / "keel-bench-data");
    PeakFlops peak = cpu_sgemm_peak(o.threads);
    std::printf("CPU backend, %d thread(s); peak %.2f GFLOP/s (%s)\n", o.threads,
                peak.flops_per_s / 1e9, peak.source.c_str());
    for (const Size& s : kSizes)
      if (std::find(o.sizes.begin(), o.sizes.end(), s.name) != o.sizes.end())
        bench_size(s, o.steps, o.threads, shards, peak.flops_per_s);
    if (o.layouts) bench_layouts(shards);
  } catch (const std::exception& e) {
    LOG(ERROR) << e.what();
    return 1;
  }
  return 0;
}

}  // namespace

namespace bench {

Command add_cpu_command(CLI::App& app) {
  auto o = std::make_shared<CpuOptions>();
  CLI::App* sub = app.add_subcommand(
      "cpu", "throughput and MFU of three model sizes on this CPU against its SGEMM peak");
  sub->add_option("--sizes", o->sizes, "tiny, small, medium, comma-separated (default all three)")
      ->option_text("LIST")
      ->delimiter(',')
      ->check(CLI::IsMember({"tiny", "small", "medium"}));
  sub->add_option("--steps", o->steps, "timed steps per size, after one warm-up step (default 5)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxSteps));
  sub->add_option("--threads", o->threads, "CPU threads (default: every core)")
      ->option_text("N")
      ->transform(cli::whole_number(1, cli::kMaxCount));
  sub->add_flag("--layouts", o->layouts,
                "then the time split and bytes moved of each parallel layout of the tiny model");
  sub->add_flag("--speed", o->speed,
                "instead: the CPU-speed report (SGEMM by OpenBLAS core type, the medium GPT with "
                "nothing set, then keel-bench recovery's snapshot rows and keel-bench restore)");
  // cpu_speed.cc's helper process: one SGEMM rate under the OpenBLAS core it was started with.
  sub->add_flag("--sgemm-child", o->sgemm_child)->group("");
  return {sub, [o] { return cpu_main(*o); }};
}

}  // namespace bench
}  // namespace keel
