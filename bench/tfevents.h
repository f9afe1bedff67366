// TensorBoard event files written without TensorFlow: Event records (proto/tfevent.proto)
// framed as TFRecords, so `tensorboard --logdir` shows keel-bench's runs as scalar curves.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "proto/tfevent.pb.h"

namespace keel::bench {

// CRC-32C (Castagnoli) of `data`, as TFRecord frames use it: crc32c("123456789") = 0xE3069283.
uint32_t crc32c(std::string_view data);

// The masked CRC TFRecord stores, so that a CRC of data holding CRCs is not degenerate.
uint32_t masked_crc32c(std::string_view data);

// One TFRecord: uint64 length, uint32 masked CRC of the length, the data, uint32 masked CRC
// of the data (all little-endian).
std::string tfrecord_frame(std::string_view data);

// The records of a TFRecord byte string; false when a length or a CRC does not match.
bool tfrecord_parse(std::string_view bytes, std::vector<std::string>* records);

// One event file in `dir` (created), named events.out.tfevents.<unix time>.<host>; its first
// record is the file_version event TensorBoard expects.
class EventWriter {
 public:
  explicit EventWriter(const std::string& dir);
  const std::string& path() const { return path_; }
  // One scalar of `tag` at `step`, stamped `wall_time` (unix seconds).
  void scalar(const std::string& tag, int64_t step, double wall_time, double value);
  // Flushes to the file; throws std::runtime_error when it could not be written.
  void close();

 private:
  void write(const tfevent::Event& e);
  std::string path_;
  std::ofstream out_;
};

}  // namespace keel::bench
