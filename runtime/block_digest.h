// The checksum of a rank's state: XXH3-64 over the XXH3-64 hashes of its fixed 64 KiB blocks,
// in order. A block's hash depends on its bytes alone, so the checksum can be computed in
// pieces, on several threads, and inside the optimizer's own pass while each block it wrote
// is still in cache (DESIGN.md, Checkpoints) — one pass over the state instead of two.
#pragma once

#include <cstddef>
#include <cstdint>

namespace keel {

inline constexpr size_t kDigestBlockBytes = size_t(64) << 10;
inline constexpr size_t kDigestBlockFloats = kDigestBlockBytes / sizeof(float);

// Blocks of a payload of `bytes` (the last may be short).
inline size_t digest_block_count(size_t bytes) {
  return (bytes + kDigestBlockBytes - 1) / kDigestBlockBytes;
}
// XXH3-64 of one block (at most kDigestBlockBytes).
uint64_t hash_block(const void* data, size_t bytes);
// The checksum from the hashes of all of a payload's blocks, in order.
uint64_t combine_block_hashes(const uint64_t* hashes, size_t count);
// The checksum of one buffer, on the calling thread.
uint64_t block_digest(const void* data, size_t bytes);

}  // namespace keel
