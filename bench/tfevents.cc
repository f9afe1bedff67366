#include "bench/tfevents.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace keel::bench {
namespace {

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

void put_le(std::string* s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s->push_back(char((v >> (8 * i)) & 0xff));
}

uint64_t get_le(std::string_view s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(s[at + size_t(i)])) << (8 * i);
  return v;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (char ch : data) c = kTable[(c ^ uint8_t(ch)) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(std::string_view data) {
  std::string len;
  put_le(&len, data.size(), 8);
  std::string out = len;
  put_le(&out, masked_crc32c(len), 4);
  out.append(data);
  put_le(&out, masked_crc32c(data), 4);
  return out;
}

bool tfrecord_parse(std::string_view bytes, std::vector<std::string>* records) {
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) return false;
    const uint64_t n = get_le(bytes, at, 8);
    if (get_le(bytes, at + 8, 4) != masked_crc32c(bytes.substr(at, 8))) return false;
    // As `n > left - 4`, not `left < n + 4`: a length near 2^64 (its CRC is easy to forge)
    // must not wrap around and send the reads past the end.
    const size_t left = bytes.size() - at - 12;
    if (left < 4 || n > left - 4) return false;
    const std::string_view data = bytes.substr(at + 12, n);
    if (get_le(bytes, at + 12 + n, 4) != masked_crc32c(data)) return false;
    records->emplace_back(data);
    at += 16 + n;
  }
  return true;
}

EventWriter::EventWriter(const std::string& dir) {
  std::filesystem::create_directories(dir);
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = dir + "/events.out.tfevents." + std::to_string(int64_t(now)) + "." + host;
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw std::runtime_error("cannot write " + path_);
  tfevent::Event e;
  e.set_wall_time(now);
  e.set_file_version("brain.Event:2");
  write(e);
}

void EventWriter::scalar(const std::string& tag, int64_t step, double wall_time, double value) {
  tfevent::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  tfevent::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(float(value));
  write(e);
}

void EventWriter::write(const tfevent::Event& e) {
  out_ << tfrecord_frame(e.SerializeAsString());
}

void EventWriter::close() {
  out_.close();
  if (out_.fail()) throw std::runtime_error("cannot write " + path_);
}

}  // namespace keel::bench
