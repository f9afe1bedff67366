#include "model/token_shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "runtime/check.h"

namespace keel {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// Writes all of buf or throws; write(2) may return short counts on large buffers.
void write_all(int fd, const void* buf, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw InputError(detail::concat(path, ": write failed: ", errno_text()));
    p += w;
    n -= size_t(w);
  }
}

}  // namespace

void write_token_shard(const std::string& path, const uint16_t* tokens, size_t count) {
  KEEL_CHECK(count <= size_t(INT32_MAX), "a shard holds at most 2^31-1 tokens, got ", count);
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = int32_t(count);
  // A unique temporary name in the same folder, so rename(2) is atomic and two writers of
  // the same shard never interleave.
  std::string tmp = detail::concat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(detail::concat(path, ": cannot create: ", errno_text()));
  try {
    write_all(fd, header, sizeof(header), path);
    write_all(fd, tokens, count * sizeof(uint16_t), path);
    KEEL_CHECK_ERRNO(::fsync(fd));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  KEEL_CHECK_ERRNO(::close(fd));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw InputError(detail::concat(path, ": cannot rename ", tmp, " into place: ", err));
  }
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  struct stat st {};
  // stat before open: opening a FIFO matched by a glob would block.
  if (::stat(path.c_str(), &st) != 0)
    throw InputError(detail::concat(path, ": cannot open: ", errno_text()));
  if (S_ISDIR(st.st_mode))
    throw InputError(detail::concat(path, ": is a directory, not a token shard"));
  if (!S_ISREG(st.st_mode))
    throw InputError(detail::concat(path, ": not a regular file, so not a token shard"));
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(detail::concat(path, ": cannot open: ", errno_text()));
  fd_ = fd;
  auto fail = [&](const std::string& what) {
    release();
    throw InputError(path + ": " + what);
  };
  if (::fstat(fd, &st) != 0) fail("cannot stat: " + errno_text());
  int64_t file_bytes = st.st_size;
  if (file_bytes < kShardHeaderBytes) {
    fail(detail::concat("file size = ", file_bytes, " bytes, shorter than the ", kShardHeaderBytes,
                        "-byte header"));
  }
  int32_t header[kShardHeaderInts];
  ssize_t got = ::pread(fd, header, sizeof(header), 0);
  if (got != ssize_t(sizeof(header))) fail("cannot read the header: " + errno_text());
  if (header[0] != kShardMagic) {
    fail(detail::concat("header magic = ", header[0], ", expected ", kShardMagic));
  } else if (header[1] != kShardVersion) {
    fail(detail::concat("header version = ", header[1], ", expected ", kShardVersion));
  } else if (header[2] <= 0) {
    fail(detail::concat("header token count = ", header[2], ", expected > 0"));
  } else if (int64_t expected = kShardHeaderBytes + 2 * int64_t(header[2]);
             file_bytes != expected) {
    fail(detail::concat("file size = ", file_bytes, " bytes, expected ", expected,
                        " for header token count = ", header[2]));
  }
  count_ = header[2];
}

void TokenShard::read(int64_t first, int64_t count, uint16_t* out) const {
  KEEL_CHECK(first >= 0 && count >= 0 && first + count <= count_, path_, ": tokens [", first, ", ",
             first + count, ") outside [0, ", count_, ")");
  char* p = reinterpret_cast<char*>(out);
  size_t left = size_t(count) * sizeof(uint16_t);
  off_t at = off_t(kShardHeaderBytes + first * int64_t(sizeof(uint16_t)));
  while (left > 0) {
    ssize_t r = ::pread(fd_, p, left, at);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw InputError(detail::concat(path_, ": read failed: ", errno_text()));
    if (r == 0) {
      struct stat st {};
      int64_t now = ::fstat(fd_, &st) == 0 ? int64_t(st.st_size) : -1;
      throw InputError(detail::concat(path_, ": truncated while in use: file size is now ", now,
                                      " bytes, was ", kShardHeaderBytes + 2 * count_,
                                      " when opened (token ", (at - kShardHeaderBytes) / 2,
                                      " is past its end)"));
    }
    p += r;
    at += r;
    left -= size_t(r);
  }
}

std::vector<uint16_t> TokenShard::read_all() const {
  std::vector<uint16_t> out(static_cast<size_t>(count_));
  read(0, count_, out.data());
  return out;
}

int64_t TokenShard::find_token_at_least(uint32_t limit) const {
  if (limit > 65535) return -1;  // every uint16 token is below it
  const uint16_t lim = uint16_t(limit);
  // 1 Mi tokens (2 MiB) per read: large enough that syscalls cost nothing, small enough to
  // stay in cache while it is scanned.
  constexpr int64_t kBlock = int64_t(1) << 20;
  constexpr int kLanes = 64;
  std::vector<uint16_t> buf(size_t(std::min(kBlock, count_)));
  for (int64_t first = 0; first < count_; first += kBlock) {
    const int64_t n = std::min(kBlock, count_ - first);
    read(first, n, buf.data());
    const uint16_t* t = buf.data();
    int64_t i = 0;
    // A max over a fixed-length run of 64 has a trip count the compiler can see, so even
    // -O2's cheap vectoriser turns it into SIMD max instructions; only a run whose max is bad
    // is searched token by token.
    for (; i + kLanes <= n; i += kLanes) {
      uint16_t m = 0;
      for (int j = 0; j < kLanes; ++j) m = t[i + j] > m ? t[i + j] : m;
      if (m >= lim) break;
    }
    for (; i < n; ++i) {
      if (t[i] >= lim) return first + i;
    }
  }
  return -1;
}

TokenShard::~TokenShard() {
  release();
}

TokenShard::TokenShard(TokenShard&& other) noexcept {
  *this = std::move(other);
}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

void TokenShard::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  count_ = 0;
}

}  // namespace keel
