#include "parallel/sealed_link.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "runtime/check.h"

namespace keel::detail {

namespace {
constexpr size_t kHeader = RecordCipher::kHeaderBytes;
constexpr size_t kTag = RecordCipher::kTagBytes;
}  // namespace

SealedLink::SealedLink(const SessionKeys& keys, bool client)
    : out_(client ? keys.to_server : keys.to_client, true),
      in_(client ? keys.to_client : keys.to_server, false) {}

void SealedLink::seal(const void* p, size_t n) {
  KEEL_CHECK(n > 0 && n <= kMaxRecord, "sealed link: a record of ", n, " bytes");
  if (!pending()) {
    wire_.clear();
    sent_ = 0;
  }
  const size_t at = wire_.size();
  wire_.resize(at + kHeader + n + kTag);
  out_.seal(p, n, wire_.data() + at);
}

SealedLink::Progress SealedLink::flush(int fd, std::string* err) {
  while (sent_ < wire_.size()) {
    ssize_t n = ::send(fd, wire_.data() + sent_, wire_.size() - sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Progress::kAgain;
      *err = std::strerror(errno);
      return Progress::kError;
    }
    sent_ += size_t(n);
  }
  return Progress::kDone;
}

SealedLink::Progress SealedLink::recv_record(int fd, void* dst, size_t room, size_t* got,
                                             std::string* err) {
  // Room for the largest record and a read-ahead, so that small messages cost one recv().
  constexpr size_t kReadAhead = size_t{64} << 10;
  if (rec_.empty()) rec_.resize(kHeader + kMaxRecord + kTag + kReadAhead);
  for (;;) {
    size_t want = kHeader;
    if (end_ - begin_ >= kHeader) {
      const size_t n = RecordCipher::length(rec_.data() + begin_);
      if (n == 0 || n > room || n > kMaxRecord) {
        *err = concat("a sealed record of ", n, " bytes where at most ", room,
                      " were expected: garbled or altered");
        note_refusal(concat("a communicator connection from ", peer_address(fd), ": ", *err));
        return Progress::kError;
      }
      want = kHeader + n + kTag;
    }
    if (end_ - begin_ >= want && want > kHeader) break;
    // Make room at the end for the rest of this record.
    if (rec_.size() - begin_ < want) {
      std::memmove(rec_.data(), rec_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    ssize_t r = ::recv(fd, rec_.data() + end_, rec_.size() - end_, MSG_DONTWAIT);
    if (r == 0) {
      *err = "connection closed";
      return Progress::kError;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Progress::kAgain;
      *err = std::strerror(errno);
      return Progress::kError;
    }
    end_ += size_t(r);
  }
  uint8_t* rec = rec_.data() + begin_;
  const size_t n = RecordCipher::length(rec);
  begin_ += kHeader + n + kTag;
  if (begin_ == end_) begin_ = end_ = 0;
  if (!in_.open(rec, rec + kHeader, n, rec + kHeader + n)) {
    *err =
        "a sealed record failed its check (altered in flight, replayed, or not of this "
        "connection)";
    note_refusal(concat("a communicator connection from ", peer_address(fd), ": ", *err));
    return Progress::kError;
  }
  std::memcpy(dst, rec + kHeader, n);
  *got = n;
  return Progress::kDone;
}

}  // namespace keel::detail
