// Checksums of snapshot payloads. Every snapshot slot, backup push and restore is verified
// end to end with XXH3-64: it runs at memory bandwidth, so checking hundreds of MB per step
// costs far less than the copy it guards.
#pragma once

#include <cstddef>
#include <cstdint>

struct XXH3_state_s;

namespace keel {

// XXH3-64 (seed 0) of one buffer.
uint64_t checksum(const void* data, size_t bytes);

// XXH3-64 over several buffers fed in order; digest() equals checksum() of their
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
  XXH3_state_s* state_;
};

}  // namespace keel
