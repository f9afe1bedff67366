#include "ckpt/backup_wire.h"

#include <algorithm>

namespace keel::backup_wire {

using detail::Clock;
using detail::IoResult;

IoResult send_chunked(SealedChannel& ch, const void* buf, size_t len,
                      std::chrono::milliseconds stall, std::string* err) {
  const char* p = static_cast<const char*>(buf);
  for (size_t off = 0; off < len; off += kChunk) {
    size_t n = std::min(kChunk, len - off);
    IoResult r = ch.send(p + off, n, Clock::now() + stall, err);
    if (r != IoResult::kOk) return r;
  }
  return IoResult::kOk;
}

IoResult recv_chunked(SealedChannel& ch, void* buf, size_t len, std::chrono::milliseconds stall,
                      ChecksumStream* sum, std::string* err) {
  char* p = static_cast<char*>(buf);
  for (size_t off = 0; off < len; off += kChunk) {
    size_t n = std::min(kChunk, len - off);
    IoResult r = ch.recv(p + off, n, Clock::now() + stall, err);
    if (r != IoResult::kOk) return r;
    if (sum) sum->update(p + off, n);
  }
  return IoResult::kOk;
}

std::string io_text(IoResult r, const std::string& err) {
  if (r == IoResult::kTimeout) return "timed out";
  return err.empty() ? "connection closed" : err;
}

}  // namespace keel::backup_wire
