// Small TCP helpers shared by the rendezvous store and the socket communicator: an owning
// file descriptor, listen/connect with deadlines, and whole-buffer send/receive that never
// block past a deadline. Internal to parallel/; not part of keel's public API.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

namespace keel::detail {

using Clock = std::chrono::steady_clock;

// Owns one file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// Milliseconds left until `deadline` for poll(), rounded up, never negative.
int poll_ms_left(Clock::time_point deadline);

void set_nonblocking(int fd);
void set_nodelay(int fd);

// A non-blocking listening socket on host:port (port 0: an ephemeral one), SO_REUSEADDR set.
// Throws keel::Error if the address cannot be resolved or bound.
Fd listen_tcp(const std::string& host, int port, int backlog);
int local_port(int fd);

// Formats host and port so that parse_host_port() reads them back ("[::1]:80" for IPv6).
std::string join_host_port(const std::string& host, int port);

// Connects to host:port, retrying refused or unreachable attempts until `deadline` (the
// server may not be listening yet). Returns a non-blocking socket; throws CommTimeout naming
// `what` and the last error when the deadline passes, keel::Error if host does not resolve.
Fd connect_tcp(const std::string& host, int port, Clock::time_point deadline,
               const std::string& what);

// One attempt to connect to host:port before `deadline`: refused (its host is up and nothing
// listens there: the process died), listening (it connected, and is closed at once), or
// silent (a host cut off or powered off drops the attempt). Throws keel::Error if host does
// not resolve.
enum class PortProbe { kRefused, kListening, kSilent };
PortProbe probe_port(const std::string& host, int port, Clock::time_point deadline);
// probe_port() == kRefused.
bool connection_refused(const std::string& host, int port, Clock::time_point deadline);

// Outcome of a whole-buffer transfer on a non-blocking socket.
enum class IoResult { kOk, kTimeout, kClosed };

// Sends all of buf (MSG_NOSIGNAL: a dead peer is an error, not a SIGPIPE). kClosed when the
// peer closed or reset the connection; `err` then holds the reason.
IoResult send_all(int fd, const void* buf, size_t len, Clock::time_point deadline,
                  std::string* err);
// Receives exactly len bytes; kClosed on end of stream or a reset.
IoResult recv_all(int fd, void* buf, size_t len, Clock::time_point deadline, std::string* err);

}  // namespace keel::detail
