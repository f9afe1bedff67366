// TFRecord parsing (bench/tfevents.h) of a record whose length field is huge but whose
// length CRC matches: refused, with no read past the end of the bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/tfevents.h"

namespace keel::bench {
namespace {

std::string le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
  return s;
}

TEST(TfRecord, ParseRefusesAWrappingLength) {
  for (uint64_t n : {~uint64_t{0}, ~uint64_t{0} - 3, ~uint64_t{0} - 11, uint64_t{1} << 40}) {
    SCOPED_TRACE(n);
    const std::string len = le(n, 8);
    const std::string bytes = len + le(masked_crc32c(len), 4) + "abcd" + le(0, 4);
    std::vector<std::string> recs;
    EXPECT_FALSE(tfrecord_parse(bytes, &recs));
    EXPECT_TRUE(recs.empty());
  }
  // 2^64 − 4 + 4 wraps to 0: a parser that adds takes the length field itself as the data,
  // checked against its own CRC (read 4 bytes before the "data"), and so accepts a record.
  const std::string len = le(~uint64_t{0} - 3, 8);
  std::vector<std::string> recs;
  EXPECT_FALSE(tfrecord_parse(len + le(masked_crc32c(len), 4) + len, &recs));
  EXPECT_TRUE(recs.empty());
}

}  // namespace
}  // namespace keel::bench
