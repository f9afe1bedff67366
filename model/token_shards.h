// llm.c token shards: a header of 256 int32 (magic 20240520, version 1, token count, the
// rest zero) followed by the tokens as uint16. This is the format llm.c's dev/data scripts
// write and its DataLoader reads, so shards move between llm.c and keel unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/check.h"  // keel::InputError, which these functions throw

namespace keel {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

// Writes `count` tokens as a shard at `path`, atomically (a temporary file renamed into
// place), so a reader never sees half a shard. Throws keel::Error on I/O failure.
void write_token_shard(const std::string& path, const uint16_t* tokens, size_t count);
inline void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_token_shard(path, tokens.data(), tokens.size());
}

// A read-only, memory-mapped shard. The constructor validates the header (magic, version,
// count > 0) and that the file size is exactly header + 2·count bytes; any mismatch is a
// keel::InputError naming the file and field, e.g.
// "data/x.bin: header magic = 123, expected 20240520".
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }  // tokens
  const uint16_t* tokens() const { return tokens_; }

 private:
  void release();
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

}  // namespace keel
