// What an intruder on a connection's path sees, for the sealing tests
// (tests/parallel/sealed_channel_test.cc, tests/ckpt/backup_sealed_test.cc).
#pragma once

#include <sys/socket.h>

#include <string>

namespace keel::test {

// Every byte waiting on `fd`, without blocking.
inline std::string drain(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) return out;
    out.append(buf, size_t(n));
  }
}

// `n` bytes of a text that would be plain to see on a wire that carried it unsealed.
inline std::string pattern(size_t n) {
  const std::string unit = "the weights of a model that must not walk out of the job. ";
  std::string s;
  while (s.size() < n) s += unit;
  s.resize(n);
  return s;
}

}  // namespace keel::test
