// keel-worker: trains one rank (or, with --nproc, supervises N local ranks). Prints one line
// per step on rank 0 and writes the report, the loss curve and llm.c weights on request.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "launcher/local_spawn.h"
#include "launcher/mfu.h"
#include "launcher/run_report.h"
#include "launcher/worker_options.h"
#include "model/data_loader.h"
#include "model/job_layout.h"
#include "model/llmc_checkpoint.h"
#include "model/plugin_loader.h"
#include "model/trainer.h"
#include "parallel/hash_store.h"
#include "parallel/process_groups.h"
#include "parallel/tcp_store.h"
#include "proto/config_loader.h"

namespace keel {
namespace {

int worker_threads(const config::JobConfig& cfg, const WorkerOptions& o) {
  if (cfg.runtime().threads() > 0) return cfg.runtime().threads();
  int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / o.local_world_size);
}

std::string layout_name(const Topology& t) {
  return detail::concat("tp", t.tp(), " pp", t.pp(), " dp", t.dp());
}

int run_worker(const WorkerOptions& o) {
  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  config::JobConfig cfg = load_config(o.config_path, o.overrides);
  Topology topo(cfg.parallel().tp(), cfg.parallel().pp(), cfg.parallel().dp());
  if (topo.world_size() != o.world_size)
    throw InputError(detail::concat(o.config_path, ": parallel.tp·pp·dp = ", topo.world_size(),
                                    " (", layout_name(topo), ") but the job has ", o.world_size,
                                    " rank(s); start it with --nproc ", topo.world_size()));
  const bool leader = o.rank == 0;
  const int threads = worker_threads(cfg, o);
  const bool cuda = cfg.runtime().device() == config::RuntimeConfig::cuda;
  const Precision precision = cfg.runtime().precision() == config::RuntimeConfig::bf16
                                  ? Precision::kBf16
                                  : Precision::kFp32;
  std::unique_ptr<Backend> backend =
      cuda ? make_cuda_backend(o.rank % std::max(1, o.local_world_size), precision)
           : make_cpu_backend(threads);
  // Measured (or read from cache) before any rank starts computing, so it sees an idle machine.
  Peak peak;
  if (leader) {
    int machine_threads = cuda ? 1
                               : std::min<int>(threads * o.local_world_size,
                                               int(std::thread::hardware_concurrency()));
    peak = device_peak(*backend, precision, machine_threads);
    if (cuda) peak.flops_per_s *= o.world_size;  // one card per rank
  }

  auto plugin = Plugin::load(cfg.model().plugin());
  DataLoader data = DataLoader::from_config(cfg);
  std::unique_ptr<DataLoader> val;
  if (cfg.train().eval_every() > 0)
    val = std::make_unique<DataLoader>(DataLoader::from_config(cfg, /*val=*/true));

  std::shared_ptr<Store> store;
  if (o.world_size > 1) {
    auto [host, port] = parse_host_port(o.store_addr);
    store = std::make_shared<TcpStore>(host, port);
  } else {
    store = std::make_shared<HashStore>();
  }
  ProcessGroupOptions gopts;
  gopts.timeout = Millis(cfg.parallel().comm_timeout_ms());
  gopts.device = backend->kind();
  gopts.cuda_device = o.rank % std::max(1, o.local_world_size);
  ProcessGroups groups = make_process_groups(topo, o.rank, store, gopts);

  Trainer trainer(cfg, backend.get(), plugin, topo, o.rank, &groups, &data);
  trainer.init_params();
  const double fpt = trainer.model_flops_per_token();

  RunReport rep;
  rep.plugin = plugin->name();
  rep.plugin_version = plugin->version();
  rep.backend = backend->name();
  rep.layout = layout_name(topo);
  rep.world_size = topo.world_size();
  rep.num_params = trainer.global_param_count();
  rep.mfu_peak_flops = peak.flops_per_s;
  rep.mfu_peak_source = peak.source;
  if (leader && !o.quiet)
    std::printf(
        "keel: %s %s, %lld params, %s on %d rank(s), %d micro-batch(es) of %d per step, "
        "backend %s\n",
        rep.plugin.c_str(), rep.plugin_version.c_str(), static_cast<long long>(rep.num_params),
        rep.layout.c_str(), rep.world_size, trainer.micro_batches(), cfg.train().micro_batch_size(),
        rep.backend.c_str());

  const int64_t steps = cfg.train().steps();
  double timed_s = 0;
  int64_t timed_tokens = 0;
  for (int64_t s = 0; s < steps; ++s) {
    StepStats st = trainer.step(s);
    rep.losses.push_back(st.loss);
    rep.grad_norms.push_back(st.grad_norm);
    rep.lrs.push_back(st.lr);
    rep.compute_s += st.compute_s;
    rep.comm_s += st.comm_s;
    rep.bubble_s += st.bubble_s;
    rep.bytes_tp += st.bytes_tp;
    rep.bytes_pp += st.bytes_pp;
    rep.bytes_dp += st.bytes_dp;
    rep.bytes_emb += st.bytes_emb;
    // The first step pays for page faults and connection warm-up; throughput excludes it
    // unless it is the only one.
    if (s > 0 || steps == 1) {
      timed_s += st.wall_s;
      timed_tokens += st.tokens;
    }
    const double tok_s = double(st.tokens) / st.wall_s;
    const double mfu = peak.flops_per_s > 0 ? fpt * tok_s / peak.flops_per_s : 0;
    if (leader && !o.quiet &&
        ((s + 1) % std::max(1, cfg.train().log_every()) == 0 || s + 1 == steps)) {
      std::printf(
          "step %5lld/%lld | loss %.6f | lr %.3e | norm %.4f | %8.0f tok/s | MFU %5.1f%% | "
          "compute %3.0f%% comm %3.0f%% bubble %3.0f%%\n",
          static_cast<long long>(s + 1), static_cast<long long>(steps), st.loss, st.lr,
          st.grad_norm, tok_s, 100 * mfu, 100 * st.compute_s / st.wall_s,
          100 * st.comm_s / st.wall_s, 100 * st.bubble_s / st.wall_s);
      std::fflush(stdout);
    }
    rep.steps_completed = s + 1;
    const int every = cfg.train().eval_every();
    if (val && ((s + 1) % every == 0 || s + 1 == steps)) {
      const double vl = trainer.evaluate(*val, cfg.train().eval_batches());
      rep.val_steps.push_back(double(s + 1));
      rep.val_losses.push_back(vl);
      if (leader && !o.quiet) {
        std::printf("eval %5lld/%lld | val loss %.6f (%d batches)\n", static_cast<long long>(s + 1),
                    static_cast<long long>(steps), vl, cfg.train().eval_batches());
        std::fflush(stdout);
      }
    }
  }
  rep.final_loss = rep.losses.empty() ? 0 : rep.losses.back();
  rep.tokens_per_s = timed_s > 0 ? double(timed_tokens) / timed_s : 0;
  rep.mfu = peak.flops_per_s > 0 ? fpt * rep.tokens_per_s / peak.flops_per_s : 0;

  NamedTensors full = trainer.gather_full_params();
  if (leader) {
    ParamDigest digest;
    for (const auto& name : trainer.canonical_names()) digest.add(name, full.at(name));
    rep.param_checksum = digest.hex();
    rep.wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
    if (!o.export_llmc_path.empty())
      write_llmc_checkpoint(o.export_llmc_path, trainer.dims(), full);
    if (!o.report_path.empty()) write_report_json(o.report_path, rep);
    if (!o.loss_svg_path.empty()) write_loss_svg(o.loss_svg_path, rep);
    if (!o.quiet)
      std::printf(
          "keel: done: %lld steps, final loss %.6f, %.0f tok/s, MFU %.1f%% of %.3g FLOP/s "
          "(%s), params %s, %.1f s\n",
          static_cast<long long>(rep.steps_completed), rep.final_loss, rep.tokens_per_s,
          100 * rep.mfu, rep.mfu_peak_flops, rep.mfu_peak_source.c_str(),
          rep.param_checksum.c_str(), rep.wall_s);
  }
  // Keep every rank's communicators alive until rank 0 has its gather: a barrier over the
  // world group, so no rank exits while another still talks to it.
  groups.world->barrier();
  return 0;
}

}  // namespace
}  // namespace keel

int main(int argc, char** argv) {
  keel::WorkerOptions o;
  try {
    if (!keel::parse_worker_options(argc, argv, &o)) return 0;
    if (o.nproc > 0) {
      std::vector<std::string> args;
      for (int i = 0; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--nproc") {
          ++i;
          continue;
        }
        args.push_back(a);
      }
      return keel::run_local_ranks(o.nproc, args);
    }
    return keel::run_worker(o);
  } catch (const keel::InputError& e) {
    std::fprintf(stderr, "keel-worker: error: %s\n", e.what());
    return 2;
  } catch (const keel::CommError& e) {
    std::fprintf(stderr, "keel-worker: rank %d: communication failed: %s\n", o.rank, e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-worker: rank %d: %s\n", o.rank, e.what());
    return 1;
  }
}
