// TensorBoard event files (bench/tfevents.h): the CRC-32C and TFRecord framing TensorBoard's
// readers check, and a written file read back into its events.
#include "bench/tfevents.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "test_paths.h"

namespace keel::bench {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720, B.4
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
}

TEST(Crc32c, MaskIsTfRecords) {
  const uint32_t c = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TfRecord, FrameLayoutAndRoundTrip) {
  const std::string f = tfrecord_frame("abc");
  ASSERT_EQ(f.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(uint8_t(f[0]), 3);
  for (int i = 1; i < 8; ++i) EXPECT_EQ(f[size_t(i)], '\0');
  EXPECT_EQ(f.substr(12, 3), "abc");
  std::vector<std::string> recs;
  ASSERT_TRUE(tfrecord_parse(f + tfrecord_frame("") + tfrecord_frame("de"), &recs));
  EXPECT_EQ(recs, (std::vector<std::string>{"abc", "", "de"}));
}

TEST(TfRecord, ParseRefusesDamage) {
  std::string f = tfrecord_frame("hello");
  std::vector<std::string> recs;
  std::string bad = f;
  bad[13] ^= 1;  // the data
  EXPECT_FALSE(tfrecord_parse(bad, &recs));
  bad = f;
  bad[0] ^= 1;  // the length
  EXPECT_FALSE(tfrecord_parse(bad, &recs));
  EXPECT_FALSE(tfrecord_parse(f.substr(0, f.size() - 1), &recs));  // cut short
}

TEST(EventWriter, WritesEventsThatParseBack) {
  const std::string dir = test::temp_dir("tfevents") + "/run";
  std::filesystem::remove_all(dir);
  EventWriter w(dir);
  w.scalar("loss", 0, 100.5, 5.5);
  w.scalar("mfu", 1, 101.5, 0.25);
  w.close();
  EXPECT_EQ(std::filesystem::path(w.path()).parent_path(), std::filesystem::path(dir));
  EXPECT_EQ(std::filesystem::path(w.path()).filename().string().rfind("events.out.tfevents.", 0),
            0u);
  std::ifstream in(w.path(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::string> recs;
  ASSERT_TRUE(tfrecord_parse(bytes, &recs));
  ASSERT_EQ(recs.size(), 3u);
  tfevent::Event e;
  ASSERT_TRUE(e.ParseFromString(recs[0]));
  EXPECT_EQ(e.file_version(), "brain.Event:2");
  ASSERT_TRUE(e.ParseFromString(recs[2]));
  EXPECT_EQ(e.step(), 1);
  EXPECT_DOUBLE_EQ(e.wall_time(), 101.5);
  ASSERT_EQ(e.summary().value_size(), 1);
  EXPECT_EQ(e.summary().value(0).tag(), "mfu");
  EXPECT_FLOAT_EQ(e.summary().value(0).simple_value(), 0.25f);
}

}  // namespace
}  // namespace keel::bench
