#include "model/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(detail::concat(path, ": cannot open: ", errno_text()));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string err = errno_text();
    ::close(fd);
    throw InputError(detail::concat(path, ": cannot stat: ", err));
  }
  int64_t file_bytes = st.st_size;
  auto fail = [&](const std::string& what) {
    ::close(fd);
    throw InputError(path + ": " + what);
  };
  if (file_bytes < kShardHeaderBytes) {
    fail(detail::concat("file size = ", file_bytes, " bytes, shorter than the ", kShardHeaderBytes,
                        "-byte header"));
  }
  void* map = ::mmap(nullptr, size_t(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) fail("mmap failed: " + errno_text());
  ::close(fd);
  map_ = map;
  map_bytes_ = size_t(file_bytes);

  const int32_t* header = static_cast<const int32_t*>(map_);
  std::string error;
  if (header[0] != kShardMagic) {
    error = detail::concat("header magic = ", header[0], ", expected ", kShardMagic);
  } else if (header[1] != kShardVersion) {
    error = detail::concat("header version = ", header[1], ", expected ", kShardVersion);
  } else if (header[2] <= 0) {
    error = detail::concat("header token count = ", header[2], ", expected > 0");
  } else if (int64_t expected = kShardHeaderBytes + 2 * int64_t(header[2]);
             file_bytes != expected) {
    error = detail::concat("file size = ", file_bytes, " bytes, expected ", expected,
                           " for header token count = ", header[2]);
  }
  if (!error.empty()) {
    release();
    throw InputError(path + ": " + error);
  }
  count_ = header[2];
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + kShardHeaderBytes);
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
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

void TokenShard::release() {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
}

}  // namespace keel
