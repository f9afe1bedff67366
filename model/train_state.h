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
#include <optional>
#include <string>
#include <vector>

#include "model/param_store.h"
#include "model/plugin.h"
#include "model/state_banks.h"
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

  // Digests of the state's bytes as they are now (runtime/block_digest.h): each span's, and
  // the block checksum of all of them that a snapshot commit records, so that memory that
  // changed at rest shows against the slot (the SDC check).
  struct Digests {
    std::vector<uint64_t> spans;  // spans() order
    uint64_t checksum = 0;
  };
  Digests digests();

  // --- living in snapshot banks (model/state_banks.h) ---
  // From the next update_begin() or rewrite_begin() on, the state lives in `banks`, which
  // must outlive it or detach_banks(). Only for a backend that updates out of place.
  void attach_banks(StateBanks* banks);
  // Copies the state back into memory of its own and lets go of the banks.
  void detach_banks();
  bool attached() const { return banks_ != nullptr; }
  // The bank the state lives in, or -1 (its own memory).
  int live_bank() const { return live_; }

  // Where an out-of-place update writes the next step: the other bank, already marked
  // invalid. Without banks, nullopt: the caller updates in place.
  struct Target {
    int bank;
    float *params, *m, *v;
  };
  std::optional<Target> update_begin();
  // The target holds step `step` with `checksum`: it becomes the live state. A failure
  // between update_begin() and here leaves the live state as it was.
  void update_commit(const Target& t, int64_t step, uint64_t checksum);

  // Bank `i` holds a snapshot of `step` that the caller has verified: the state now lives
  // there (a restore from the own slot copies nothing). A bank beyond 0 and 1 (the verified
  // snapshot) is left at the next write and never written.
  void adopt_bank(int i, int64_t step);

  // A whole-state write from outside the optimizer (a restore, a load, an init): between
  // rewrite_begin() and rewrite_commit() spans() point at the other bank (marked invalid),
  // so the live snapshot stays intact until the new state is complete; rewrite_commit()
  // checksums it and makes it live at step(). rewrite_abort() goes back to the old one.
  // Without banks all three only write in place.
  void rewrite_begin();
  // `checksum`: the state's block checksum if the caller already knows it (a restore that
  // verified what it loaded); else it is computed here.
  void rewrite_commit(std::optional<uint64_t> checksum = std::nullopt);
  void rewrite_abort();

  // A digest of the layout (names, shapes, TP split, flags, buffer sizes): two states with
  // the same fingerprint have spans of the same sizes and meanings. A snapshot or checkpoint
  // of another layout or model is refused by comparing it.
  uint64_t layout_fingerprint() const;

 private:
  Target target(int bank);  // bank `bank`'s spans
  int other_bank() const;   // where the next update or rewrite writes
  void point_at(int bank);  // the state lives in bank `bank` from now on

  Backend* backend_;
  ParamStore params_;
  size_t moment_floats_;
  int64_t step_ = 0;
  StateBanks* banks_ = nullptr;
  int live_ = -1;          // bank holding the live state; -1: params_ owns it
  int rewrite_from_ = -1;  // during a rewrite into the other bank: the bank live before it
};

// The floats of each AdamW moment a rank holds: all `padded` of its parameters' buffer, or
// with ZeRO-1 over `dp_size` > 1 replicas its equal shard of them.
size_t moment_floats(size_t padded, int dp_size, bool zero1);

// TrainState::layout_fingerprint() of a state laid out as `slots` with these buffer sizes,
// computed without one (a checkpoint reader checks another layout's rank files with it).
uint64_t layout_fingerprint(const std::vector<ParamSlot>& slots, size_t padded,
                            size_t moment_floats);

// rewrite_begin() ... rewrite_commit() as a scope: leaving it by an exception aborts.
class StateRewrite {
 public:
  explicit StateRewrite(TrainState& s) : s_(s) { s_.rewrite_begin(); }
  ~StateRewrite() {
    if (!done_) s_.rewrite_abort();
  }
  StateRewrite(const StateRewrite&) = delete;
  StateRewrite& operator=(const StateRewrite&) = delete;
  void commit(std::optional<uint64_t> checksum = std::nullopt) {
    s_.rewrite_commit(checksum);
    done_ = true;
  }

 private:
  TrainState& s_;
  bool done_ = false;
};

}  // namespace keel
