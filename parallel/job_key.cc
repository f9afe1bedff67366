#include "parallel/job_key.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "runtime/check.h"

namespace keel {
namespace {

void init_sodium() {
  // Idempotent and thread-safe; fails only if the kernel has no random source.
  KEEL_CHECK(sodium_init() >= 0, "sodium_init failed (no random source?)");
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Initialised at load time, before main() can fork: a process's children that never
// adopt another key still share this one with it.
JobKey& process_key_slot() {
  static JobKey key = JobKey::generate();
  return key;
}
[[maybe_unused]] const bool kKeyAtLoad = (process_key_slot(), true);

}  // namespace

JobKey JobKey::generate() {
  init_sodium();
  JobKey k;
  randombytes_buf(k.bytes_.data(), k.bytes_.size());
  return k;
}

JobKey JobKey::from_hex(std::string_view hex, const std::string& source) {
  while (!hex.empty() && std::isspace(static_cast<unsigned char>(hex.back()))) hex.remove_suffix(1);
  while (!hex.empty() && std::isspace(static_cast<unsigned char>(hex.front())))
    hex.remove_prefix(1);
  if (hex.size() != 2 * kBytes)
    throw InputError(detail::concat(source, ": not a job secret (", hex.size(),
                                    " characters, expected ", 2 * kBytes, " hex digits)"));
  JobKey k;
  for (size_t i = 0; i < kBytes; ++i) {
    int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      throw InputError(source + ": not a job secret (a character that is not a hex digit)");
    k.bytes_[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return k;
}

JobKey JobKey::from_bytes(std::string_view bytes, const std::string& source) {
  if (bytes.size() != kBytes)
    throw InputError(
        detail::concat(source, ": a job key of ", bytes.size(), " bytes, expected ", kBytes));
  JobKey k;
  std::memcpy(k.bytes_.data(), bytes.data(), kBytes);
  return k;
}

JobKey JobKey::load(const std::string& path) {
  // Never through a link, and judged on the descriptor that is read: the file is this user's
  // own, a plain file, mode 0600 (one another user planted or can read is no secret).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    throw InputError(detail::concat("job secret ", path, ": ",
                                    errno == ELOOP ? "a link, not the file" : std::strerror(errno),
                                    " (it lives in the job's run directory, mode 0600)"));
  struct stat st {};
  std::string text(2 * kBytes + 64, '\0');
  ssize_t n = ::fstat(fd, &st) == 0 ? ::read(fd, text.data(), text.size()) : -1;
  int err = errno;
  ::close(fd);
  if (n < 0) throw InputError(detail::concat("job secret ", path, ": ", std::strerror(err)));
  if (!S_ISREG(st.st_mode))
    throw InputError(detail::concat("job secret ", path, ": not a plain file"));
  if (st.st_uid != ::geteuid())
    throw InputError(detail::concat("job secret ", path, ": owned by uid ", st.st_uid,
                                    ", not this user (uid ", ::geteuid(), ")"));
  if (st.st_mode & 077)
    throw InputError(detail::concat("job secret ", path, ": mode ", std::oct, (st.st_mode & 0777),
                                    std::dec, " lets others read it; it must be 0600 (chmod 600 ",
                                    path, ")"));
  text.resize(static_cast<size_t>(n));
  return from_hex(text, "job secret " + path);
}

void JobKey::save(const std::string& path) const {
  // A temporary of a name no one can guess, made exclusively (0600, never through a link),
  // then renamed over `path`: a reader sees the whole secret or none.
  std::string tmp = path + ".tmp.XXXXXX";
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) throw Error(detail::concat("job secret ", tmp, ": ", std::strerror(errno)));
  const std::string text = hex() + "\n";
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  int err = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok) err = errno;
    ::unlink(tmp.c_str());
    throw Error(detail::concat("job secret ", path, ": ", std::strerror(err)));
  }
}

std::string JobKey::hex() const {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes_) {
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

JobKey::Bytes JobKey::derive(std::string_view label) const {
  Bytes out{};
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, bytes_.data(), bytes_.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(label.data()),
                                label.size());
  crypto_auth_hmacsha256_final(&st, out.data());
  return out;
}

bool JobKey::operator==(const JobKey& o) const {
  return sodium_memcmp(bytes_.data(), o.bytes_.data(), kBytes) == 0;
}

const JobKey& process_job_key() {
  return process_key_slot();
}

void set_process_job_key(const JobKey& key) {
  process_key_slot() = key;
}

std::string adopt_inherited_job_key() {
  if (const char* fd_text = std::getenv(kSecretFdEnv)) {
    const int fd = std::atoi(fd_text);
    std::string text(2 * JobKey::kBytes + 1, '\0');
    ssize_t n = fd > 2 ? ::read(fd, text.data(), text.size()) : -1;
    if (fd > 2) ::close(fd);
    ::unsetenv(kSecretFdEnv);
    if (n < 0)
      throw InputError(detail::concat(kSecretFdEnv, "=", fd_text,
                                      ": cannot read the job secret from the parent's pipe"));
    text.resize(static_cast<size_t>(n));
    set_process_job_key(JobKey::from_hex(text, std::string("the pipe of ") + kSecretFdEnv));
    return "parent";
  }
  if (char* value = std::getenv(kSecretEnv)) {
    JobKey k = JobKey::from_hex(value, kSecretEnv);
    // The value lives in the block /proc/PID/environ shows: wipe it there, then unset.
    sodium_memzero(value, std::strlen(value));
    ::unsetenv(kSecretEnv);
    set_process_job_key(k);
    return kSecretEnv;
  }
  return "";
}

}  // namespace keel
