#include "launcher/worker/rank_backend.h"

#include <algorithm>
#include <thread>

#include "runtime/check.h"
#include "runtime/text.h"

namespace keel {

Precision config_precision(const config::JobConfig& cfg) {
  return cfg.runtime().precision() == config::RuntimeConfig::bf16 ? Precision::kBf16
                                                                  : Precision::kFp32;
}

int rank_threads(const config::JobConfig& cfg, int local_world_size) {
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = cfg.runtime().threads();
  // The config's bound holds on every machine; this one is the machine's: OpenMP threads
  // that spin for work many to a core starve each other (1000 on 2 cores stalled the job
  // instead of starting it).
  if (cfg.runtime().device() == config::RuntimeConfig::cpu && threads > kMaxThreadsPerCore * cores)
    throw InputError(detail::concat(
        "runtime.threads = ", threads, ": this machine has ", cores, " core(s), and more than ",
        kMaxThreadsPerCore, " threads a core stall the workers instead of training (set at most ",
        kMaxThreadsPerCore * cores, ", or 0: one share of the cores per worker)"));
  if (threads > 0) return threads;
  return std::max(1, cores / std::max(1, local_world_size));
}

std::unique_ptr<Backend> make_rank_backend(const config::JobConfig& cfg, int rank,
                                           int local_world_size) {
  if (cfg.runtime().device() == config::RuntimeConfig::cuda)
    return make_cuda_backend(rank % std::max(1, local_world_size), config_precision(cfg));
  return make_cpu_backend(rank_threads(cfg, local_world_size));
}

}  // namespace keel
