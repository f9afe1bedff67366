// Block checksums of payloads fed at once or in pieces; see checksum.h.
#include "ckpt/checksum.h"

// Whole blocks go through hash_block (runtime/block_digest.cc, the inlined AVX2 path); only
// blocks fed in pieces use the library's streaming state, which gives the same values.
#include <xxhash.h>

#include <algorithm>

#include "runtime/block_digest.h"
#include "runtime/check.h"

namespace keel {

uint64_t checksum(const void* data, size_t bytes) {
  return block_digest(data, bytes);
}

ChecksumStream::ChecksumStream() : block_(XXH3_createState()) {
  KEEL_CHECK(block_ != nullptr, "XXH3_createState: out of memory");
  reset();
}

ChecksumStream::~ChecksumStream() {
  XXH3_freeState(block_);
}

void ChecksumStream::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    if (block_fill_ == 0 && bytes >= kDigestBlockBytes) {
      // Whole blocks skip the streaming state: the common case, and the fast one.
      hashes_.push_back(hash_block(p, kDigestBlockBytes));
      p += kDigestBlockBytes;
      bytes -= kDigestBlockBytes;
      continue;
    }
    const size_t n = std::min(bytes, kDigestBlockBytes - block_fill_);
    KEEL_CHECK(XXH3_64bits_update(block_, p, n) == XXH_OK);
    block_fill_ += n;
    p += n;
    bytes -= n;
    if (block_fill_ == kDigestBlockBytes) {
      hashes_.push_back(XXH3_64bits_digest(block_));
      KEEL_CHECK(XXH3_64bits_reset(block_) == XXH_OK);
      block_fill_ = 0;
    }
  }
}

uint64_t ChecksumStream::digest() const {
  if (block_fill_ == 0) return combine_block_hashes(hashes_.data(), hashes_.size());
  std::vector<uint64_t> all = hashes_;
  all.push_back(XXH3_64bits_digest(block_));
  return combine_block_hashes(all.data(), all.size());
}

void ChecksumStream::reset() {
  KEEL_CHECK(XXH3_64bits_reset(block_) == XXH_OK);
  block_fill_ = 0;
  hashes_.clear();
}

}  // namespace keel
