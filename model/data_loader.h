// Reads training samples from llm.c token shards by global sample number (DESIGN.md, Data).
// Step s with global batch G uses global samples [s·G, (s+1)·G); a DP replica and
// micro-batch ask for their slice of that range. A read is a pure function of (files, T,
// order, seed, step, G, sample): there is no cursor to save, so a restored or resized job
// reads exactly the samples it would have read without the interruption.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/token_shards.h"
#include "proto/config.pb.h"
#include "runtime/check.h"  // keel::InputError, which these functions throw

namespace keel {

class DataLoader {
 public:
  using Order = config::DataConfig::Order;

  // Opens every shard matching `glob`, in sorted order (as llm.c's glob(3) does), and
  // validates their headers. `field` names the config field the glob came from, for errors
  // (zero matches → InputError naming the glob and the field; so is a directory it matches).
  // If vocab_size > 0, every token of every shard is checked here, before any read: a token
  // >= vocab_size is an InputError naming the shard, the position and the value.
  DataLoader(const std::string& glob, int seq_len, Order order, uint64_t seed,
             std::string field = "data.train_files", int vocab_size = 0);

  // The training (val = false) or validation loader of a validated job config. In
  // sequential order (always, for validation) a shard shorter than one global batch is an
  // InputError here, not at the first read. A token check that took over a second is
  // logged ("checked N tokens in M shard(s) of data.train_files in X s").
  static DataLoader from_config(const config::JobConfig& cfg, bool val = false);

  // Fills inputs and targets ([count·T] each) with samples first .. first+count-1 of step
  // `step`'s global batch of `global_batch` sequences; targets are inputs shifted by one.
  //  - sequential: exactly llm.c's DataLoader (1 process, no shuffling) with B = G: batch
  //    `step` starts at pos, sample j is tokens [pos + j·T, pos + j·T + T + 1); a shard
  //    holds floor((ntok − 1)/(G·T)) batches; after the last shard the data wraps around.
  //  - shuffled: global sample g is window perm_e(g mod W) of epoch e = g / W, where the W
  //    windows are the T+1 tokens at offsets k·T of every shard and perm_e is a
  //    pseudo-random permutation keyed by (seed, e).
  // A shard too small for one batch (sequential) or one window (shuffled) is an InputError.
  // Thread-safe: the loader has no mutable state.
  void read(int64_t step, int global_batch, int first, int count, int32_t* inputs,
            int32_t* targets) const;

  const std::vector<std::string>& files() const { return files_; }
  int seq_len() const { return T_; }
  Order order() const { return order_; }
  int64_t num_tokens() const { return num_tokens_; }
  // Seconds the constructor spent checking tokens against vocab_size (0 without a vocab).
  double check_seconds() const { return check_seconds_; }
  // Windows of T+1 tokens in one pass over the data (the shuffled order's epoch length).
  int64_t num_windows() const { return window_prefix_.back(); }
  // Steps in one pass over the data in sequential order with this global batch.
  int64_t steps_per_epoch(int global_batch) const;

 private:
  // Batches of `global_batch` sequences in each shard (sequential order).
  std::vector<int64_t> batches_per_shard(int global_batch) const;
  void copy_sample(size_t shard, int64_t offset, int32_t* inputs, int32_t* targets) const;

  std::string glob_, field_;
  int T_;
  Order order_;
  uint64_t seed_;
  int vocab_size_;
  std::vector<std::string> files_;
  std::vector<TokenShard> shards_;
  std::vector<int64_t> window_prefix_;  // window_prefix_[i]: windows in shards [0, i)
  int64_t num_tokens_ = 0;
  double check_seconds_ = 0;
};

// A pseudo-random permutation of [0, n) keyed by (seed, stream): a balanced Feistel network
// over the smallest even power of two >= n, with cycle-walking back into [0, n). O(1) memory
// and time per index, so an epoch of billions of windows needs no table.
int64_t permute_index(int64_t index, int64_t n, uint64_t seed, uint64_t stream);

}  // namespace keel
