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

// A read-only shard, read through pread(2) rather than mapped. A mapped file that is
// truncated or replaced while the job runs turns the next access past its new end into a
// SIGBUS that kills the rank with no word of which file; a read(2) instead returns short,
// which becomes an InputError naming the file. (Catching SIGBUS and unwinding out of the
// handler would need a process-wide handler shared with every library in the process and a
// siglongjmp across C++ frames; a syscall per sample costs nothing next to a step.)
// The constructor validates the header (magic, version, count > 0) and that the file size is
// exactly header + 2·count bytes; any mismatch is a keel::InputError naming the file and
// field, e.g. "data/x.bin: header magic = 123, expected 20240520". A directory or other
// non-regular file is refused by name.
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

  // Copies tokens [first, first + count) to out. A file that has shrunk since it was opened
  // is an InputError naming it ("... truncated while in use"). Thread-safe.
  void read(int64_t first, int64_t count, uint16_t* out) const;
  std::vector<uint16_t> read_all() const;

  // The position of the first token >= limit, or -1 if there is none: one pass over the
  // file in large blocks, the comparison vectorised (a few GB/s, bounded by the page cache).
  int64_t find_token_at_least(uint32_t limit) const;

 private:
  void release();
  std::string path_;
  int fd_ = -1;
  int64_t count_ = 0;
};

}  // namespace keel
