// Block checksums on XXH3; see block_digest.h.
#include "runtime/block_digest.h"

// Inlined rather than called in Debian's libxxhash, which is built for baseline x86-64 (its
// SSE2 path, about 10 GB/s here): compiled with keel's -march the AVX2 path hashes at
// 20-29 GB/s. Same algorithm, same values.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <vector>

namespace keel {

namespace detail {
uint64_t hash_block_avx512(const void* data, size_t bytes);  // block_digest_avx512.cc
}

uint64_t hash_block(const void* data, size_t bytes) {
  // libgcc's check covers the OS having enabled the 512-bit registers too.
  static const bool avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return avx512 ? detail::hash_block_avx512(data, bytes) : XXH3_64bits(data, bytes);
}

uint64_t combine_block_hashes(const uint64_t* hashes, size_t count) {
  // Hashed as little-endian words; keel runs on little-endian machines only.
  return XXH3_64bits(hashes, count * sizeof(uint64_t));
}

uint64_t block_digest(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  std::vector<uint64_t> hashes(digest_block_count(bytes));
  for (size_t i = 0; i < hashes.size(); ++i) {
    const size_t off = i * kDigestBlockBytes;
    hashes[i] = hash_block(p + off, std::min(kDigestBlockBytes, bytes - off));
  }
  return combine_block_hashes(hashes.data(), hashes.size());
}

}  // namespace keel
