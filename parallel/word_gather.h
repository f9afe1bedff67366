// Every rank's few 64-bit words (digests, flags) to every rank of a group, in rank order, over
// a communicator whose collectives move floats: the words travel as float pairs, bit for bit
// (nothing on the way does arithmetic on them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "parallel/communicator.h"

namespace keel {

// `n` words from each rank; the result holds rank r's at [r·n, (r+1)·n). Throws CommError.
std::vector<uint64_t> all_gather_words(Communicator& group, const uint64_t* mine, size_t n);

}  // namespace keel
