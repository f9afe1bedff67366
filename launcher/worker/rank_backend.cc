#include "launcher/worker/rank_backend.h"

#include <algorithm>
#include <thread>

namespace keel {

Precision config_precision(const config::JobConfig& cfg) {
  return cfg.runtime().precision() == config::RuntimeConfig::bf16 ? Precision::kBf16
                                                                  : Precision::kFp32;
}

int rank_threads(const config::JobConfig& cfg, int local_world_size) {
  if (cfg.runtime().threads() > 0) return cfg.runtime().threads();
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local_world_size));
}

std::unique_ptr<Backend> make_rank_backend(const config::JobConfig& cfg, int rank,
                                           int local_world_size) {
  if (cfg.runtime().device() == config::RuntimeConfig::cuda)
    return make_cuda_backend(rank % std::max(1, local_world_size), config_precision(cfg));
  return make_cpu_backend(rank_threads(cfg, local_world_size));
}

}  // namespace keel
