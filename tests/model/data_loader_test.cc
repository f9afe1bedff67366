// Token shards and the DataLoader: llm.c's format and batch order reproduced exactly, global
// sample numbering independent of how the batch is sliced, a deterministic shuffled order,
// and errors that name the file and field. Also keel-prepare-data end to end.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "model/data_loader.h"
#include "model/token_shards.h"
#include "runtime/check.h"
#include "tests/test_expect.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using Order = config::DataConfig;

template <typename F>
std::string error_of(F&& f) {
  return test::input_error_of(std::forward<F>(f));
}

// Tokens that say where they are: shard s, position i → s·1000 + i (mod 2^16), so a sample
// identifies its shard and offset by its first token.
std::vector<uint16_t> tagged_tokens(int shard, int n) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = uint16_t(shard * 1000 + i);
  return t;
}

// Writes shards of the given sizes as dir/train_000.bin, ... and returns their glob.
std::string write_shards(const std::string& dir, const std::vector<int>& sizes) {
  for (size_t s = 0; s < sizes.size(); ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "train_%03zu.bin", s);
    write_token_shard(dir + "/" + name, tagged_tokens(int(s), sizes[s]));
  }
  return dir + "/train_*.bin";
}

// llm.c's DataLoader (llmc/dataloader.h) for process_rank 0 of 1, no shuffling, transcribed
// loop for loop: init loads shard 0; next_batch advances to the next shard when the current
// one has no batch left, and resets to shard 0 after the last one.
class LlmcReferenceLoader {
 public:
  LlmcReferenceLoader(std::vector<std::vector<uint16_t>> shards, size_t B, size_t T)
      : shards_(std::move(shards)), B_(B), T_(T) {
    reset();
  }
  void next_batch(std::vector<int>* inputs, std::vector<int>* targets) {
    if (current_sample_idx_ >= shard_num_samples_) advance();
    const std::vector<uint16_t>& tokens = shards_[current_shard_idx_];
    size_t total_batch_size_bytes = B_ * T_ * sizeof(uint16_t);  // num_processes = 1
    size_t offset = current_sample_idx_ * total_batch_size_bytes / sizeof(uint16_t);
    inputs->resize(B_ * T_);
    targets->resize(B_ * T_);
    for (size_t i = 0; i < B_ * T_; ++i) {
      (*inputs)[i] = int(tokens[offset + i]);
      (*targets)[i] = int(tokens[offset + i + 1]);
    }
    current_sample_idx_ += 1;
  }

 private:
  void load_shard(size_t idx) {
    size_t ntok = shards_[idx].size();
    // "-1 uint16_t due to us taking B*T+1 tokens but moving by B*T tokens"
    shard_num_samples_ =
        (ntok * sizeof(uint16_t) - sizeof(uint16_t)) / (B_ * T_ * sizeof(uint16_t));
  }
  void reset() {
    current_shard_idx_ = 0;
    current_sample_idx_ = 0;
    load_shard(0);
  }
  void advance() {
    if (current_shard_idx_ == shards_.size() - 1) {
      reset();
      return;
    }
    current_shard_idx_ = (current_shard_idx_ + 1) % shards_.size();
    current_sample_idx_ = 0;
    load_shard(current_shard_idx_);
  }
  std::vector<std::vector<uint16_t>> shards_;
  size_t B_, T_;
  size_t current_shard_idx_ = 0, current_sample_idx_ = 0, shard_num_samples_ = 0;
};

TEST(ShardTest, WriteAndMapRoundTrip) {
  std::string dir = test::temp_dir("shard");
  std::vector<uint16_t> tokens = {0, 1, 65535, 256, 42, 7};
  write_token_shard(dir + "/a.bin", tokens);
  EXPECT_EQ(fs::file_size(dir + "/a.bin"), 1024u + 2 * tokens.size());
  TokenShard s(dir + "/a.bin");
  EXPECT_EQ(s.path(), dir + "/a.bin");
  ASSERT_EQ(s.size(), int64_t(tokens.size()));
  EXPECT_EQ(s.read_all(), tokens);
  // The header is llm.c's: magic, version, count, zeros.
  std::ifstream in(dir + "/a.bin", std::ios::binary);
  int32_t header[256];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 6);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0);
  // No temporary left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  TokenShard moved = std::move(s);
  EXPECT_EQ(moved.size(), 6);
  EXPECT_EQ(moved.read_all()[2], 65535);
}

// Rewrites int32 header[index] of a shard.
void patch_header(const std::string& path, int index, int32_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(index * 4);
  f.write(reinterpret_cast<const char*>(&value), 4);
}

TEST(ShardTest, BadHeaderAndSizeAreNamed) {
  std::string dir = test::temp_dir("shard-bad");
  std::string p = dir + "/x.bin";
  write_token_shard(p, tagged_tokens(0, 10));
  patch_header(p, 0, 123);
  EXPECT_HAS(error_of([&] { TokenShard s(p); }), p + ": header magic = 123, expected 20240520");

  write_token_shard(p, tagged_tokens(0, 10));
  patch_header(p, 1, 2);
  EXPECT_HAS(error_of([&] { TokenShard s(p); }), p + ": header version = 2, expected 1");

  write_token_shard(p, tagged_tokens(0, 10));
  patch_header(p, 2, 11);
  EXPECT_HAS(error_of([&] { TokenShard s(p); }),
             p + ": file size = 1044 bytes, expected 1046 for header token count = 11");

  write_token_shard(p, tagged_tokens(0, 10));
  patch_header(p, 2, 0);
  EXPECT_HAS(error_of([&] { TokenShard s(p); }), p + ": header token count = 0");

  write_token_shard(p, tagged_tokens(0, 10));
  fs::resize_file(p, 1024 + 2 * 10 + 1);
  EXPECT_HAS(error_of([&] { TokenShard s(p); }), p + ": file size = 1045 bytes, expected 1044");

  fs::resize_file(p, 100);
  EXPECT_HAS(error_of([&] { TokenShard s(p); }), p + ": file size = 100 bytes, shorter than");

  EXPECT_HAS(error_of([&] { TokenShard s(dir + "/missing.bin"); }),
             dir + "/missing.bin: cannot open");
}

TEST(DataLoaderTest, NoMatchNamesGlobAndField) {
  std::string dir = test::temp_dir("dl-nomatch");
  std::string glob = dir + "/train_*.bin";
  std::string e = error_of([&] { DataLoader d(glob, 4, Order::sequential, 1); });
  EXPECT_HAS(e, "data.train_files = \"" + glob + "\": no file matches");
  e = error_of([&] { DataLoader d(glob, 4, Order::sequential, 1, "data.val_files"); });
  EXPECT_HAS(e, "data.val_files");
}

TEST(DataLoaderTest, SequentialIsLlmcDataLoader) {
  std::string dir = test::temp_dir("dl-seq");
  // Uneven shards with leftovers, so batches end early in a shard and the order wraps.
  const std::vector<int> sizes = {50, 33, 61};
  std::string glob = write_shards(dir, sizes);
  for (int G : {1, 3, 4}) {
    const int T = 5;
    std::vector<std::vector<uint16_t>> shards;
    for (size_t s = 0; s < sizes.size(); ++s) shards.push_back(tagged_tokens(int(s), sizes[s]));
    LlmcReferenceLoader ref(shards, size_t(G), T);
    DataLoader loader(glob, T, Order::sequential, 1);
    int64_t per_epoch = 0;
    for (int n : sizes) per_epoch += (n - 1) / (G * T);
    EXPECT_EQ(loader.steps_per_epoch(G), per_epoch);
    std::vector<int> want_in, want_tg;
    std::vector<int32_t> in(size_t(G * T)), tg(size_t(G * T));
    for (int64_t step = 0; step < 3 * per_epoch + 2; ++step) {
      ref.next_batch(&want_in, &want_tg);
      loader.read(step, G, 0, G, in.data(), tg.data());
      ASSERT_EQ(std::vector<int>(in.begin(), in.end()), want_in) << "G " << G << " step " << step;
      ASSERT_EQ(std::vector<int>(tg.begin(), tg.end()), want_tg) << "G " << G << " step " << step;
    }
  }
}

TEST(DataLoaderTest, SequentialWrapsToTheFirstShard) {
  std::string dir = test::temp_dir("dl-wrap");
  std::string glob = write_shards(dir, {21, 21});  // 2 batches of 2·5 each (20 + 1 tokens)
  DataLoader loader(glob, 5, Order::sequential, 1);
  ASSERT_EQ(loader.steps_per_epoch(2), 4);
  std::vector<int32_t> in(10), tg(10);
  const int32_t first_token[] = {0, 10, 1000, 1010, 0, 10};
  for (int step = 0; step < 6; ++step) {
    loader.read(step, 2, 0, 2, in.data(), tg.data());
    EXPECT_EQ(in[0], first_token[step]) << "step " << step;
    EXPECT_EQ(tg[0], first_token[step] + 1);
    EXPECT_EQ(in[5], first_token[step] + 5);  // sample 1 starts T later
  }
}

TEST(DataLoaderTest, SlicesDoNotDependOnHowTheBatchIsSplit) {
  std::string dir = test::temp_dir("dl-slice");
  std::string glob = write_shards(dir, {97, 130});
  const int T = 4, G = 8;
  for (auto order : {Order::sequential, Order::shuffled}) {
    DataLoader loader(glob, T, order, 7);
    for (int64_t step = 0; step < 20; ++step) {
      std::vector<int32_t> whole_in(G * T), whole_tg(G * T);
      loader.read(step, G, 0, G, whole_in.data(), whole_tg.data());
      for (int replicas : {2, 4, 8}) {
        std::vector<int32_t> in(G * T), tg(G * T);
        int per = G / replicas;
        for (int r = 0; r < replicas; ++r) {
          loader.read(step, G, r * per, per, in.data() + r * per * T, tg.data() + r * per * T);
        }
        ASSERT_EQ(in, whole_in) << "order " << order << " step " << step << " dp " << replicas;
        ASSERT_EQ(tg, whole_tg);
      }
    }
  }
}

TEST(DataLoaderTest, PermuteIndexIsABijection) {
  for (int64_t n : {1, 2, 3, 5, 16, 17, 100, 1000, 4097}) {
    std::vector<bool> hit(size_t(n), false);
    for (int64_t i = 0; i < n; ++i) {
      int64_t p = permute_index(i, n, 42, 9);
      ASSERT_GE(p, 0);
      ASSERT_LT(p, n);
      ASSERT_FALSE(hit[size_t(p)]) << "n " << n << ": " << p << " twice";
      hit[size_t(p)] = true;
    }
  }
  // The key matters.
  int same = 0;
  for (int64_t i = 0; i < 1000; ++i)
    same += permute_index(i, 1000, 1, 0) == permute_index(i, 1000, 2, 0);
  EXPECT_LT(same, 50);
}

TEST(DataLoaderTest, ShuffledCoversEveryWindowOncePerEpoch) {
  std::string dir = test::temp_dir("dl-shuf");
  const int T = 4, G = 3;
  std::string glob = write_shards(dir, {41, 30, 57});  // 10 + 7 + 14 = 31 windows
  DataLoader loader(glob, T, Order::shuffled, 1337);
  ASSERT_EQ(loader.num_windows(), 31);
  // Every window the loader may return: first token → (shard, k).
  std::set<int32_t> windows;
  for (int s : {0, 1, 2}) {
    int n = std::vector<int>{41, 30, 57}[size_t(s)];
    for (int k = 0; k < (n - 1) / T; ++k) windows.insert(s * 1000 + k * T);
  }
  ASSERT_EQ(windows.size(), 31u);

  // Two epochs' worth of samples, read a step at a time.
  std::vector<int32_t> order;
  std::vector<int32_t> in(G * T), tg(G * T);
  for (int64_t step = 0; step * G < 2 * 31; ++step) {
    loader.read(step, G, 0, G, in.data(), tg.data());
    for (int j = 0; j < G; ++j) {
      for (int i = 0; i < T; ++i) {
        ASSERT_EQ(in[j * T + i], in[j * T] + i);  // a window is contiguous
        ASSERT_EQ(tg[j * T + i], in[j * T] + i + 1);
      }
      order.push_back(in[j * T]);
    }
  }
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int32_t> seen(order.begin() + epoch * 31, order.begin() + (epoch + 1) * 31);
    EXPECT_EQ(seen, windows) << "epoch " << epoch;
  }
  // Not the file order, and epochs differ.
  std::vector<int32_t> file_order(windows.begin(), windows.end());
  EXPECT_NE(std::vector<int32_t>(order.begin(), order.begin() + 31), file_order);
  EXPECT_NE(std::vector<int32_t>(order.begin(), order.begin() + 31),
            std::vector<int32_t>(order.begin() + 31, order.begin() + 62));

  // Differs from sequential; same seed → same order; another seed → another order.
  DataLoader seq(glob, T, Order::sequential, 1337);
  DataLoader again(glob, T, Order::shuffled, 1337);
  DataLoader other(glob, T, Order::shuffled, 1338);
  std::vector<int32_t> a(G * T), b(G * T), c(G * T), d(G * T), tmp(G * T);
  bool differs_seq = false, differs_seed = false;
  for (int64_t step = 0; step < 10; ++step) {
    loader.read(step, G, 0, G, a.data(), tmp.data());
    again.read(step, G, 0, G, b.data(), tmp.data());
    seq.read(step, G, 0, G, c.data(), tmp.data());
    other.read(step, G, 0, G, d.data(), tmp.data());
    EXPECT_EQ(a, b);
    differs_seq = differs_seq || a != c;
    differs_seed = differs_seed || a != d;
  }
  EXPECT_TRUE(differs_seq);
  EXPECT_TRUE(differs_seed);
}

TEST(DataLoaderTest, ShardTooSmallIsNamed) {
  std::string dir = test::temp_dir("dl-small");
  write_token_shard(dir + "/train_000.bin", tagged_tokens(0, 100));
  write_token_shard(dir + "/train_001.bin", tagged_tokens(1, 20));
  DataLoader loader(dir + "/train_*.bin", 4, Order::sequential, 1);
  std::vector<int32_t> in(8 * 4), tg(8 * 4);
  // 20 tokens < 8·4 + 1.
  std::string e = error_of([&] { loader.read(0, 8, 0, 8, in.data(), tg.data()); });
  EXPECT_HAS(e, dir + "/train_001.bin: 20 tokens, fewer than one batch");
  EXPECT_HAS(e, "= 33");
  EXPECT_HAS(e, "data.train_files");
  // A smaller batch fits.
  EXPECT_NO_THROW(loader.read(0, 4, 0, 4, in.data(), tg.data()));

  write_token_shard(dir + "/train_002.bin", tagged_tokens(2, 4));
  e = error_of([&] { DataLoader d(dir + "/train_*.bin", 4, Order::shuffled, 1); });
  EXPECT_HAS(e, dir + "/train_002.bin: 4 tokens, fewer than one sample");
}

TEST(DataLoaderTest, TokenOutsideVocabIsNamed) {
  std::string dir = test::temp_dir("dl-vocab");
  std::vector<uint16_t> t(20, 5);
  t[6] = 300;
  write_token_shard(dir + "/train_000.bin", t);
  // Refused when the loader is made, before any read.
  std::string e = error_of([&] {
    DataLoader d(dir + "/train_*.bin", 4, Order::sequential, 1, "data.train_files", 256);
  });
  EXPECT_HAS(e, dir + "/train_000.bin: token 300 at position 6 >= model.vocab_size = 256");
  // Without a vocabulary nothing is checked.
  EXPECT_NO_THROW(DataLoader(dir + "/train_*.bin", 4, Order::sequential, 1));
}

// The up-front pass finds the first bad token wherever it lies: in the vectorised body of a
// block, in a block's scalar tail, past the first 1 Mi-token block, in a later shard.
TEST(DataLoaderTest, EveryTokenOfEveryShardIsChecked) {
  std::string dir = test::temp_dir("dl-vocab-all");
  const int64_t n = (int64_t(1) << 20) + 1000;
  for (int64_t pos : {int64_t(0), int64_t(19900), int64_t(63), int64_t(64), int64_t(1 << 20) - 1,
                      int64_t(1 << 20), n - 1}) {
    std::vector<uint16_t> good(size_t(n), 255), bad(size_t(n), 7);
    bad[size_t(pos)] = 256;
    bad[size_t(n - 1)] = 65535;  // a later bad token is not the one named
    if (pos == n - 1) bad[size_t(pos)] = 256;
    write_token_shard(dir + "/train_000.bin", good);
    write_token_shard(dir + "/train_001.bin", bad);
    std::string e = error_of([&] {
      DataLoader d(dir + "/train_*.bin", 4, Order::sequential, 1, "data.train_files", 256);
    });
    EXPECT_HAS(e, detail::concat(dir, "/train_001.bin: token 256 at position ", pos,
                                 " >= model.vocab_size = 256 (data.train_files)"));
  }
  // 65536 is every uint16 token.
  EXPECT_NO_THROW(DataLoader(dir + "/train_*.bin", 4, Order::sequential, 1, "f", 65536));
}

TEST(DataLoaderTest, DirectoryMatchedByGlobIsNamed) {
  std::string dir = test::temp_dir("dl-dir");
  write_token_shard(dir + "/train_000.bin", tagged_tokens(0, 100));
  fs::create_directory(dir + "/train_old");
  std::string e = error_of([&] { DataLoader d(dir + "/train_*", 4, Order::sequential, 1); });
  EXPECT_HAS(
      e, dir + "/train_old: is a directory, matched by data.train_files = \"" + dir + "/train_*\"");
  EXPECT_HAS(error_of([&] { TokenShard s(dir + "/train_old"); }),
             dir + "/train_old: is a directory");
}

// A shard cut short while the job reads it (a re-run of the data preparation, a full disk)
// ends the read with the file's name, not a SIGBUS.
TEST(DataLoaderTest, ShardTruncatedWhileOpenIsNamed) {
  std::string dir = test::temp_dir("dl-trunc");
  std::string path = dir + "/train_000.bin";
  write_token_shard(path, tagged_tokens(0, 1000));
  DataLoader loader(dir + "/train_*.bin", 4, Order::sequential, 1, "data.train_files", 65536);
  std::vector<int32_t> in(8 * 4), tg(8 * 4);
  EXPECT_NO_THROW(loader.read(20, 8, 0, 8, in.data(), tg.data()));
  fs::resize_file(path, 1024 + 2 * 100);
  std::string e = error_of([&] { loader.read(20, 8, 0, 8, in.data(), tg.data()); });
  EXPECT_HAS(e, path + ": truncated while in use: file size is now 1224 bytes, was 3024");
}

// A validation shard is read a global batch at a time; one too short for that is refused when
// the loader is made, not at the first evaluation.
TEST(DataLoaderTest, ShortShardRefusedByFromConfig) {
  std::string dir = test::temp_dir("dl-short-val");
  write_token_shard(dir + "/train_000.bin", tagged_tokens(0, 200));
  write_token_shard(dir + "/val_000.bin", tagged_tokens(1, 60));
  config::JobConfig cfg;
  cfg.mutable_model()->set_seq_len(8);
  cfg.mutable_model()->set_vocab_size(65536);
  cfg.mutable_train()->set_global_batch_size(8);  // a batch is 8·8 + 1 = 65 tokens
  cfg.mutable_data()->set_train_files(dir + "/train_*.bin");
  cfg.mutable_data()->set_val_files(dir + "/val_*.bin");
  EXPECT_NO_THROW(DataLoader::from_config(cfg));
  std::string e = error_of([&] { DataLoader::from_config(cfg, /*val=*/true); });
  EXPECT_HAS(e, dir + "/val_000.bin: 60 tokens, fewer than one batch");
  EXPECT_HAS(e, "8 · 8 + 1 = 65 (data.val_files)");
  // So is a training shard in sequential order.
  cfg.mutable_train()->set_global_batch_size(32);
  EXPECT_HAS(error_of([&] { DataLoader::from_config(cfg); }),
             dir + "/train_000.bin: 200 tokens, fewer than one batch");
}

TEST(DataLoaderTest, FromConfig) {
  std::string dir = test::temp_dir("dl-config");
  write_token_shard(dir + "/train_000.bin", tagged_tokens(0, 200));
  write_token_shard(dir + "/val_000.bin", tagged_tokens(1, 100));
  config::JobConfig cfg;
  cfg.mutable_model()->set_seq_len(8);
  cfg.mutable_model()->set_vocab_size(65536);
  cfg.mutable_data()->set_train_files(dir + "/train_*.bin");
  cfg.mutable_data()->set_val_files(dir + "/val_*.bin");
  cfg.mutable_data()->set_order(config::DataConfig::shuffled);
  DataLoader train = DataLoader::from_config(cfg);
  DataLoader val = DataLoader::from_config(cfg, /*val=*/true);
  EXPECT_EQ(train.order(), Order::shuffled);
  EXPECT_EQ(val.order(), Order::sequential);  // evaluation always sees the same samples
  EXPECT_EQ(val.files(), std::vector<std::string>{dir + "/val_000.bin"});
  EXPECT_EQ(train.num_tokens(), 200);
  cfg.mutable_data()->set_val_files(dir + "/nothing_*.bin");
  EXPECT_HAS(error_of([&] { DataLoader::from_config(cfg, true); }), "data.val_files");
}

TEST(DataPrepareTest, PrepareDataWritesByteShards) {
  std::string dir = test::temp_dir("prep");
  std::string text1 = "Hello, keel!\n", text2 = std::string(1000, 'x') + "\xc3\xa9\n";
  std::ofstream(dir + "/a.txt") << text1;
  std::ofstream(dir + "/b.txt") << text2;
  std::ofstream(dir + "/bin.dat", std::ios::binary) << std::string("ab\0cd", 5);
  std::string out = dir + "/out";
  std::string cmd = test::bin_dir() + "/keel-prepare-data --out " + out +
                    " --val-fraction 0.25 --shard-tokens 300 --prefix demo_ " + dir + "/a.txt " +
                    dir + "/bin.dat " + dir + "/b.txt > " + dir + "/log.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::string all = text1 + text2;
  size_t n_val = size_t(double(all.size()) * 0.25), n_train = all.size() - n_val;
  // Read back every shard of a split, in name order.
  auto read_split = [&](const std::string& split, size_t* shards) {
    std::vector<uint16_t> tokens;
    *shards = 0;
    for (size_t s = 0;; ++s) {
      char name[64];
      std::snprintf(name, sizeof(name), "/demo_%s_%06zu.bin", split.c_str(), s);
      if (!fs::exists(out + name)) break;
      TokenShard shard(out + name);
      EXPECT_LE(shard.size(), 300);
      std::vector<uint16_t> got = shard.read_all();
      tokens.insert(tokens.end(), got.begin(), got.end());
      ++*shards;
    }
    return tokens;
  };
  size_t train_shards = 0, val_shards = 0;
  std::vector<uint16_t> train = read_split("train", &train_shards);
  std::vector<uint16_t> val = read_split("val", &val_shards);
  EXPECT_EQ(train_shards, (n_train + 299) / 300);
  EXPECT_EQ(val_shards, 1u);
  std::vector<uint16_t> want;
  for (unsigned char ch : all) want.push_back(ch);
  EXPECT_EQ(train, std::vector<uint16_t>(want.begin(), want.begin() + long(n_train)));
  EXPECT_EQ(val, std::vector<uint16_t>(want.begin() + long(n_train), want.end()));
  std::ifstream log(dir + "/log.txt");
  std::string log_text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_HAS(log_text, "skipping " + dir + "/bin.dat");

  // Bad usage fails with a message.
  std::string bad = test::bin_dir() + "/keel-prepare-data --out " + out + " --val-fraction 1 " +
                    dir + "/a.txt > /dev/null 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
}

}  // namespace
}  // namespace keel
