#include "parallel/word_gather.h"

#include <cstring>

namespace keel {

std::vector<uint64_t> all_gather_words(Communicator& group, const uint64_t* mine, size_t n) {
  static_assert(sizeof(uint64_t) == 2 * sizeof(float));
  std::vector<float> all(size_t(group.size()) * n * 2);
  std::memcpy(all.data() + size_t(group.rank()) * n * 2, mine, n * sizeof(uint64_t));
  group.all_gather(all.data(), n * 2);
  std::vector<uint64_t> words(size_t(group.size()) * n);
  std::memcpy(words.data(), all.data(), words.size() * sizeof(uint64_t));
  return words;
}

}  // namespace keel
