// Every byte of one rank's training state that is not a pure function of (config, seed, step,
// rank): this coordinate's parameter shards, its AdamW moments (the ZeRO-1 shard where
// sharded) and the number of optimizer steps completed. Data order and RNG are pure
// functions of the step, so they are not here.
//
// The TrainState outlives everything that borrows it: the Trainer, the communicators, the
// snapshotter. Snapshots, backups, persistent checkpoints and restores read and write a
// TrainState through spans() and nothing else (DESIGN.md, State and seams).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/param_store.h"
#include "model/plugin.h"
#include "runtime/backend.h"

namespace keel {

// One contiguous range of state in the backend's memory (device memory on GPU).
struct StateSpan {
  const char* name;  // "params", "adam_m", "adam_v"
  float* data;
  size_t floats;
  size_t bytes() const { return floats * sizeof(float); }
};

class TrainState {
 public:
  // Lays out this coordinate's parameters (`descs` in describe order) and allocates the
  // moments: the whole buffer, or with `zero1` one of `dp_size` equal shards.
  TrainState(Backend* backend, std::vector<keel_param_desc> descs, int tp_rank, int tp_size,
             int dp_size, bool zero1);

  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  Backend* backend() const { return backend_; }

  // Optimizer steps completed; the next step to run.
  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }

  // The state's bytes in a fixed order: parameters, first moments, second moments. Gradients
  // are not state (each step recomputes them from zero).
  std::vector<StateSpan> spans();
  size_t bytes() const;

  // A digest of the layout (names, shapes, TP split, flags, buffer sizes): two states with
  // the same fingerprint have spans of the same sizes and meanings. A snapshot or checkpoint
  // of another layout or model is refused by comparing it.
  uint64_t layout_fingerprint() const;

 private:
  Backend* backend_;
  ParamStore params_;
  size_t moment_floats_;
  int64_t step_ = 0;
};

}  // namespace keel
