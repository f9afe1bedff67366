// The device a process of the job computes on, as its config and its place on the machine
// say: a training worker, a stop-time replay worker and a diagnostic stand-in all pick it the
// same way, so that a check runs on what the rank runs on.
#pragma once

#include <memory>

#include "proto/config.pb.h"
#include "runtime/backend.h"

namespace keel {

// runtime.precision as the backend's GEMM precision.
Precision config_precision(const config::JobConfig& cfg);

// The most CPU threads a worker may run per core of its machine (runtime.threads).
inline constexpr int kMaxThreadsPerCore = 8;

// CPU threads per process: runtime.threads, else the machine's cores ÷ the processes on it.
// Throws InputError naming runtime.threads when it is past kMaxThreadsPerCore × the cores.
int rank_threads(const config::JobConfig& cfg, int local_world_size);

// runtime.device: the GPU `rank` mod `local_world_size` with CUDA, else a CPU backend of
// rank_threads() threads.
std::unique_ptr<Backend> make_rank_backend(const config::JobConfig& cfg, int rank,
                                           int local_world_size);

}  // namespace keel
