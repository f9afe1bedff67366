// Every parameter byte of one (tp, pp) coordinate, owned by the runtime: parameters,
// gradients and AdamW moments as flat buffers on the training device, one segment per
// parameter in the plugin's describe order. Flat buffers make data-parallel buckets,
// ZeRO-1 shards and (later) snapshots plain ranges of memory.
//
// Initialisation is sharding-independent: element i of a global tensor is drawn from
// Philox keyed by (seed, parameter name, i), and a rank computes only the global indices of
// its shard. So a TP or PP run starts from exactly the weights of the single-rank run.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/llmc_checkpoint.h"
#include "model/plugin.h"
#include "runtime/backend.h"

namespace keel {

struct ParamSlot {
  keel_param_desc desc;
  std::string name;
  std::vector<int64_t> local_shape;
  size_t offset = 0;  // floats into the flat buffers
  size_t numel = 0;   // local elements
  bool tied_copy() const { return desc.flags & KEEL_PARAM_TIED_COPY; }
  bool decays() const { return desc.flags & KEEL_PARAM_WEIGHT_DECAY; }
  bool tp_sharded() const { return desc.tp_dim >= 0; }
};

// Global flat index of every local element of a shard, and the reverse copy helpers.
// Shard rule (model/plugin.h): dim tp_dim is tp_blocks equal blocks, each split evenly.
void shard_from_full(const keel_param_desc& d, int tp_rank, int tp_size, const float* full,
                     float* local);
void full_from_shard(const keel_param_desc& d, int tp_rank, int tp_size, const float* local,
                     float* full);
size_t global_numel(const keel_param_desc& d);

// One contiguous run of a TP shard: `count` elements at `local` in the shard are elements
// [global, global + count) of the row-major global tensor.
struct ShardRun {
  size_t local = 0, global = 0, count = 0;
};
// The runs of rank `tp_rank`'s shard, in ascending local (and global) order.
std::vector<ShardRun> shard_runs(const keel_param_desc& d, int tp_rank, int tp_size);

// Where each parameter of one (tp, pp) coordinate lies in the flat buffers, and their padded
// size: what ParamStore allocates, computed without allocating (a checkpoint reader plans
// reads of another layout's files with it).
struct ParamLayout {
  std::vector<ParamSlot> slots;
  size_t padded = 0;
};
ParamLayout lay_out_params(const std::vector<keel_param_desc>& descs, int tp_size, int align_to);

class ParamStore {
 public:
  // Lays out the descriptors; `align_to` pads the total so it splits into that many equal
  // shards (the DP size, for ZeRO-1). Moments are allocated for `moment_numel` floats
  // (the whole buffer, or one ZeRO-1 shard); 0 means the whole buffer.
  ParamStore(Backend* backend, std::vector<keel_param_desc> descs, int tp_rank, int tp_size,
             int align_to);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  void allocate_moments(size_t numel);
  // Points parameters and moments at memory the store does not own (a TrainState living in
  // its snapshot slots), freeing its own; gradients stay. own_state_buffers() copies them
  // back into memory of its own (`moment_numel` floats of each moment).
  void use_state_buffers(float* params, float* m, float* v);
  void own_state_buffers(size_t moment_numel);

  const std::vector<ParamSlot>& slots() const { return slots_; }
  size_t padded_numel() const { return padded_; }
  float* params() { return params_; }
  float* grads() { return grads_; }
  float* m() { return m_; }
  float* v() { return v_; }
  float* param(int i) { return params_ + slots_[i].offset; }
  float* grad(int i) { return grads_ + slots_[i].offset; }
  // Number of parameters of the global model this coordinate holds (tied copies excluded).
  int64_t local_count() const;

  void zero_grads();
  void init(uint64_t seed);
  // Loads the shards of full tensors by name; throws InputError naming a missing or
  // wrongly sized tensor (`source` is named in the message).
  void load_full(const NamedTensors& full, const std::string& source);
  // This coordinate's parameters as host copies of the local shards, in slot order.
  std::vector<std::vector<float>> local_to_host();

 private:
  Backend* backend_;
  int tp_rank_, tp_size_;
  std::vector<ParamSlot> slots_;
  size_t padded_ = 0;
  float *params_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  bool owns_state_ = true;  // params_, m_, v_ (grads_ always)
};

}  // namespace keel
