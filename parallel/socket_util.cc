#include "parallel/socket_util.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "parallel/comm_error.h"
#include "runtime/check.h"

namespace keel::detail {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) throw Error(concat("cannot resolve ", host, ":", port, ": ", gai_strerror(rc)));
  return AddrInfoPtr(res);
}

bool is_closed_errno(int e) {
  return e == EPIPE || e == ECONNRESET || e == ECONNABORTED || e == ENOTCONN || e == ETIMEDOUT ||
         e == EHOSTUNREACH || e == ENETUNREACH || e == ENETRESET;
}

// One connect attempt bounded by `deadline`; returns the socket or sets `err`.
// One connection attempt; on failure `err` says why and `code` (if given) holds the errno
// (ETIMEDOUT when the deadline passed).
Fd try_connect(const addrinfo* ai, Clock::time_point deadline, std::string* err,
               int* code = nullptr) {
  Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
  KEEL_CHECK_ERRNO(fd.get());
  set_nonblocking(fd.get());
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS) {
    if (code) *code = errno;
    *err = std::strerror(errno);
    return Fd();
  }
  pollfd p{fd.get(), POLLOUT, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, poll_ms_left(deadline));
  } while (rc < 0 && errno == EINTR);
  KEEL_CHECK_ERRNO(rc);
  if (rc == 0) {
    if (code) *code = ETIMEDOUT;
    *err = "connect timed out";
    return Fd();
  }
  int so_error = 0;
  socklen_t len = sizeof(so_error);
  KEEL_CHECK_ERRNO(::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len));
  if (so_error != 0) {
    if (code) *code = so_error;
    *err = std::strerror(so_error);
    return Fd();
  }
  return fd;
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int poll_ms_left(Clock::time_point deadline) {
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  KEEL_CHECK_ERRNO(flags);
  KEEL_CHECK_ERRNO(::fcntl(fd, F_SETFL, flags | O_NONBLOCK));
}

void set_nodelay(int fd) {
  int one = 1;
  KEEL_CHECK_ERRNO(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)));
}

Fd listen_tcp(const std::string& host, int port, int backlog) {
  AddrInfoPtr res = resolve(host, port, true);
  std::string last_err = "no address";
  for (const addrinfo* ai = res.get(); ai; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last_err = std::strerror(errno);
      continue;
    }
    // A restarted server must be able to take its port back while old connections linger
    // in TIME_WAIT.
    int one = 1;
    KEEL_CHECK_ERRNO(::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
      last_err = std::strerror(errno);
      continue;
    }
    set_nonblocking(fd.get());
    return fd;
  }
  throw Error(concat("cannot listen on ", join_host_port(host, port), ": ", last_err));
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  KEEL_CHECK_ERRNO(::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len));
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

std::string join_host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return concat("[", host, "]:", port);
  return concat(host, ":", port);
}

Fd connect_tcp(const std::string& host, int port, Clock::time_point deadline,
               const std::string& what) {
  AddrInfoPtr res = resolve(host, port, false);
  std::string err = "deadline passed before the first attempt";
  for (;;) {
    for (const addrinfo* ai = res.get(); ai; ai = ai->ai_next) {
      Fd fd = try_connect(ai, deadline, &err);
      if (fd.valid()) return fd;
    }
    if (Clock::now() >= deadline) break;
    // The listener may not exist yet; retry at a pace that costs nothing noticeable.
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(20), deadline - Clock::now()));
  }
  throw CommTimeout(concat("timed out connecting to ", what, " at ", join_host_port(host, port),
                           " (last error: ", err, ")"));
}

PortProbe probe_port(const std::string& host, int port, Clock::time_point deadline) {
  AddrInfoPtr res = resolve(host, port, false);
  bool refused = false;
  for (const addrinfo* ai = res.get(); ai; ai = ai->ai_next) {
    std::string err;
    int code = 0;
    if (try_connect(ai, deadline, &err, &code).valid()) return PortProbe::kListening;
    refused = refused || code == ECONNREFUSED;
  }
  return refused ? PortProbe::kRefused : PortProbe::kSilent;
}

bool connection_refused(const std::string& host, int port, Clock::time_point deadline) {
  return probe_port(host, port, deadline) == PortProbe::kRefused;
}

IoResult send_all(int fd, const void* buf, size_t len, Clock::time_point deadline,
                  std::string* err) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      if (!is_closed_errno(errno)) KEEL_CHECK_ERRNO(n);
      *err = std::strerror(errno);
      return IoResult::kClosed;
    }
    pollfd pf{fd, POLLOUT, 0};
    int rc = ::poll(&pf, 1, poll_ms_left(deadline));
    if (rc < 0 && errno == EINTR) continue;
    KEEL_CHECK_ERRNO(rc);
    if (rc == 0) return IoResult::kTimeout;
  }
  return IoResult::kOk;
}

IoResult recv_all(int fd, void* buf, size_t len, Clock::time_point deadline, std::string* err) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      *err = "connection closed by peer";
      return IoResult::kClosed;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      if (!is_closed_errno(errno)) KEEL_CHECK_ERRNO(n);
      *err = std::strerror(errno);
      return IoResult::kClosed;
    }
    pollfd pf{fd, POLLIN, 0};
    int rc = ::poll(&pf, 1, poll_ms_left(deadline));
    if (rc < 0 && errno == EINTR) continue;
    KEEL_CHECK_ERRNO(rc);
    if (rc == 0) return IoResult::kTimeout;
  }
  return IoResult::kOk;
}

}  // namespace keel::detail
