// XXH3-64 wrappers; see checksum.h.
#include "ckpt/checksum.h"

#include <xxhash.h>

#include "runtime/check.h"

namespace keel {

uint64_t checksum(const void* data, size_t bytes) {
  return XXH3_64bits(data, bytes);
}

ChecksumStream::ChecksumStream() : state_(XXH3_createState()) {
  KEEL_CHECK(state_ != nullptr, "XXH3_createState: out of memory");
  reset();
}

ChecksumStream::~ChecksumStream() {
  XXH3_freeState(state_);
}

void ChecksumStream::update(const void* data, size_t bytes) {
  KEEL_CHECK(XXH3_64bits_update(state_, data, bytes) == XXH_OK);
}

uint64_t ChecksumStream::digest() const {
  return XXH3_64bits_digest(state_);
}

void ChecksumStream::reset() {
  KEEL_CHECK(XXH3_64bits_reset(state_) == XXH_OK);
}

}  // namespace keel
