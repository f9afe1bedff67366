// Checksums of snapshot payloads. Every snapshot slot, backup push and restore is verified
// end to end with the block checksum of runtime/block_digest.h (XXH3-64 over the XXH3-64
// hashes of 64 KiB blocks): it runs at memory bandwidth, and the optimizer computes it for a
// state that lives in its snapshot slots while writing it (model/train_state.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

struct XXH3_state_s;

namespace keel {

// The block checksum of one buffer.
uint64_t checksum(const void* data, size_t bytes);

// The same over several buffers fed in order; digest() equals checksum() of their
// concatenation, so a payload received or copied in pieces is checked without a second pass.
class ChecksumStream {
 public:
  ChecksumStream();
  ~ChecksumStream();
  ChecksumStream(const ChecksumStream&) = delete;
  ChecksumStream& operator=(const ChecksumStream&) = delete;

  void update(const void* data, size_t bytes);
  // The checksum of everything fed so far; more may be fed afterwards.
  uint64_t digest() const;
  // Starts over, as if newly constructed.
  void reset();

 private:
  XXH3_state_s* block_;           // the block being fed
  size_t block_fill_ = 0;         // its bytes so far
  std::vector<uint64_t> hashes_;  // of the blocks completed
};

}  // namespace keel
