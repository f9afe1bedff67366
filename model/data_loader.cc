#include "model/data_loader.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <iomanip>
#include <utility>

#include "runtime/check.h"
#include "runtime/logging.h"
#include "runtime/rng.h"

namespace keel {
namespace {

std::vector<std::string> expand_glob(const std::string& pattern, const std::string& field) {
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0) files.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) {
    throw InputError(detail::concat(field, " = \"", pattern, "\": glob failed (code ", rc, ")"));
  }
  if (files.empty()) {
    throw InputError(detail::concat(field, " = \"", pattern, "\": no file matches"));
  }
  // glob(3) sorts by the locale's collation; byte order is the same in every locale, so
  // every worker and llm.c under LC_ALL=C see the shards in one order.
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int64_t permute_index(int64_t index, int64_t n, uint64_t seed, uint64_t stream) {
  KEEL_CHECK(n > 0 && index >= 0 && index < n, "index ", index, " outside [0, ", n, ")");
  if (n == 1) return 0;
  int bits = std::bit_width(uint64_t(n - 1));
  int half = (bits + 1) / 2;
  uint64_t mask = (uint64_t(1) << half) - 1;
  uint64_t x = uint64_t(index);
  // A Feistel network is a bijection of [0, 4^half) whatever its round function; walking
  // the cycle until the value lands below n restricts it to a bijection of [0, n), and since
  // 4^half < 4n the walk takes fewer than four passes on average.
  do {
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 6; ++round) {
      uint64_t f = rng::bits(seed, stream, round << 32 | right) & mask;
      uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = left << half | right;
  } while (x >= uint64_t(n));
  return int64_t(x);
}

DataLoader::DataLoader(const std::string& glob, int seq_len, Order order, uint64_t seed,
                       std::string field, int vocab_size)
    : glob_(glob),
      field_(std::move(field)),
      T_(seq_len),
      order_(order),
      seed_(seed),
      vocab_size_(vocab_size) {
  KEEL_CHECK(seq_len > 0, "seq_len = ", seq_len);
  files_ = expand_glob(glob_, field_);
  window_prefix_.push_back(0);
  for (const auto& f : files_) {
    struct stat st {};
    if (::stat(f.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      // Without this, a folder such as data/train_old/ matched by data/train_* would fail
      // later as an unreadable shard.
      throw InputError(detail::concat(f, ": is a directory, matched by ", field_, " = \"", glob_,
                                      "\"; the glob must match token shards only"));
    }
    shards_.emplace_back(f);
    const TokenShard& s = shards_.back();
    num_tokens_ += s.size();
    // llm.c reads T+1 tokens per sample and moves by T, hence the −1.
    window_prefix_.push_back(window_prefix_.back() + (s.size() - 1) / T_);
    if (order_ == config::DataConfig::shuffled && s.size() < T_ + 1) {
      throw InputError(detail::concat(f, ": ", s.size(), " tokens, fewer than one sample of ",
                                      "model.seq_len + 1 = ", T_ + 1, " (", field_, ")"));
    }
  }
  if (vocab_size_ > 0) {
    // Every token, up front: a bad token deep in the data would otherwise stop the run at
    // the step that first reads it, hours in.
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& s : shards_) {
      int64_t at = s.find_token_at_least(uint32_t(vocab_size_));
      if (at >= 0) {
        uint16_t tok = 0;
        s.read(at, 1, &tok);
        throw InputError(detail::concat(s.path(), ": token ", tok, " at position ", at,
                                        " >= model.vocab_size = ", vocab_size_, " (", field_, ")"));
      }
    }
    check_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

DataLoader DataLoader::from_config(const config::JobConfig& cfg, bool val) {
  // Validation always reads in file order so that every evaluation sees the same samples.
  DataLoader d(val ? cfg.data().val_files() : cfg.data().train_files(), cfg.model().seq_len(),
               val ? config::DataConfig::sequential : cfg.data().order(), cfg.train().seed(),
               val ? "data.val_files" : "data.train_files", cfg.model().vocab_size());
  // Sequential order needs one global batch per shard; say so now rather than at the first
  // step (or, for validation, at the first evaluation).
  if (d.order() == config::DataConfig::sequential)
    d.steps_per_epoch(cfg.train().global_batch_size());
  // Only worth a line when a user would notice the wait.
  if (d.check_seconds() > 1.0) {
    LOG(INFO) << "checked " << d.num_tokens() << " tokens in " << d.files().size()
              << " shard(s) of " << d.field_ << " in " << std::fixed << std::setprecision(1)
              << d.check_seconds() << " s";
  }
  return d;
}

std::vector<int64_t> DataLoader::batches_per_shard(int global_batch) const {
  KEEL_CHECK(global_batch > 0, "global_batch = ", global_batch);
  int64_t batch_tokens = int64_t(global_batch) * T_;
  std::vector<int64_t> batches;
  for (const auto& s : shards_) {
    // As llm.c's dataloader_init, every shard must hold at least one batch.
    if (s.size() < batch_tokens + 1) {
      throw InputError(
          detail::concat(s.path(), ": ", s.size(), " tokens, fewer than one batch of ",
                         "train.global_batch_size · model.seq_len + 1 = ", global_batch, " · ", T_,
                         " + 1 = ", batch_tokens + 1, " (", field_, ")"));
    }
    batches.push_back((s.size() - 1) / batch_tokens);
  }
  return batches;
}

int64_t DataLoader::steps_per_epoch(int global_batch) const {
  int64_t total = 0;
  for (int64_t b : batches_per_shard(global_batch)) total += b;
  return total;
}

void DataLoader::copy_sample(size_t shard, int64_t offset, int32_t* inputs,
                             int32_t* targets) const {
  const TokenShard& s = shards_[shard];
  // Through pread (TokenShard says why); T+1 uint16 on the stack for the usual T.
  uint16_t small[1025];
  std::vector<uint16_t> large;
  uint16_t* tok = small;
  if (T_ + 1 > 1025) {
    large.resize(size_t(T_) + 1);
    tok = large.data();
  }
  s.read(offset, T_ + 1, tok);
  if (vocab_size_ > 0) {
    // Checked up front too; this catches a shard rewritten in place since.
    for (int64_t i = 0; i <= T_; ++i) {
      if (tok[i] >= vocab_size_) {
        throw InputError(detail::concat(s.path(), ": token ", tok[i], " at position ", offset + i,
                                        " >= model.vocab_size = ", vocab_size_));
      }
    }
  }
  for (int64_t i = 0; i < T_; ++i) {
    inputs[i] = tok[i];
    targets[i] = tok[i + 1];
  }
}

void DataLoader::read(int64_t step, int global_batch, int first, int count, int32_t* inputs,
                      int32_t* targets) const {
  KEEL_CHECK(
      step >= 0 && global_batch > 0 && first >= 0 && count >= 0 && first + count <= global_batch,
      "step ", step, ", samples [", first, ", ", first + count, ") of a batch of ", global_batch);
  if (order_ == config::DataConfig::sequential) {
    // Recomputed per call (a pass over the shard list) so that the loader holds no mutable
    // state and concurrent reads need no lock.
    std::vector<int64_t> batches = batches_per_shard(global_batch);
    int64_t total = 0;
    for (int64_t b : batches) total += b;
    int64_t batch = step % total;
    size_t shard = 0;
    while (batch >= batches[shard]) batch -= batches[shard++];
    int64_t pos = batch * global_batch * T_;
    for (int i = 0; i < count; ++i) {
      copy_sample(shard, pos + int64_t(first + i) * T_, inputs + int64_t(i) * T_,
                  targets + int64_t(i) * T_);
    }
    return;
  }
  int64_t windows = num_windows();
  for (int i = 0; i < count; ++i) {
    int64_t g = step * global_batch + first + i;
    int64_t epoch = g / windows;
    int64_t w =
        permute_index(g % windows, windows, seed_, rng::stream("data.shuffle", uint64_t(epoch)));
    size_t shard = size_t(std::upper_bound(window_prefix_.begin(), window_prefix_.end(), w) -
                          window_prefix_.begin()) -
                   1;
    copy_sample(shard, (w - window_prefix_[shard]) * T_, inputs + int64_t(i) * T_,
                targets + int64_t(i) * T_);
  }
}

}  // namespace keel
