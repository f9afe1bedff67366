#include "parallel/peer_auth.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "parallel/socket_util.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

using detail::Clock;
using detail::IoResult;
using Mac = std::array<uint8_t, 32>;

constexpr char kMagic[8] = {'K', 'E', 'E', 'L', 'H', 'S', '0', '1'};
constexpr uint8_t kAccepted = 0x4b;

std::atomic<int64_t> g_refusals{0};

// The key the MACs of one channel are made with.
Mac channel_key(const JobKey& key, const AuthChannel& ch) {
  std::string label = "keel-handshake/1";
  label += '\0';
  label += ch.purpose;
  label += '\0';
  for (int i = 0; i < 8; ++i) label += static_cast<char>((ch.epoch >> (8 * i)) & 0xff);
  return key.derive(label);
}

Mac proof(const Mac& k, const char* who, const uint8_t* client_nonce, const uint8_t* server_nonce) {
  Mac out{};
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, k.data(), k.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(who),
                                std::strlen(who) + 1);
  crypto_auth_hmacsha256_update(&st, client_nonce, 32);
  crypto_auth_hmacsha256_update(&st, server_nonce, 32);
  crypto_auth_hmacsha256_final(&st, out.data());
  return out;
}

// The session keys both ends derive once the proofs are exchanged.
SessionKeys session_keys(const Mac& k, const uint8_t* client_nonce, const uint8_t* server_nonce) {
  SessionKeys s;
  s.to_server = proof(k, "to server", client_nonce, server_nonce);
  s.to_client = proof(k, "to client", client_nonce, server_nonce);
  return s;
}

}  // namespace

std::string peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown peer";
  if (ss.ss_family == AF_UNIX) return "a local socket";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return detail::join_host_port(host, port);
}

namespace {

// One log line per second at most: a flood of intruders must not fill the disk or the
// terminal, and the count says how many went unlogged.
void log_refusal(const std::string& text) {
  static std::mutex mu;
  static Clock::time_point last{};
  static int64_t unlogged = 0;
  std::lock_guard<std::mutex> lock(mu);
  const auto now = Clock::now();
  if (now - last < std::chrono::seconds(1)) {
    ++unlogged;
    return;
  }
  last = now;
  LOG(WARNING) << "refused " << text
               << (unlogged ? detail::concat(" (and ", unlogged, " more since the last line)")
                            : std::string());
  unlogged = 0;
}

void send_or_throw(int fd, const void* p, size_t n, Clock::time_point deadline,
                   const std::string& what) {
  std::string err;
  IoResult r = detail::send_all(fd, p, n, deadline, &err);
  if (r == IoResult::kTimeout) throw CommTimeout(what + ": handshake timed out");
  if (r != IoResult::kOk) throw AuthError(what + ": handshake: " + err);
}

void recv_or_throw(int fd, void* p, size_t n, Clock::time_point deadline, const std::string& what,
                   const char* refused) {
  std::string err;
  IoResult r = detail::recv_all(fd, p, n, deadline, &err);
  if (r == IoResult::kTimeout) throw CommTimeout(what + ": handshake timed out");
  if (r != IoResult::kOk) throw AuthError(what + ": " + refused);
}

}  // namespace

SessionKeys authenticate_to_server(int fd, const AuthChannel& channel, Clock::time_point deadline,
                                   const std::string& what, const JobKey& key) {
  std::array<uint8_t, 40> hello{};
  std::memcpy(hello.data(), kMagic, sizeof(kMagic));
  randombytes_buf(hello.data() + 8, 32);
  send_or_throw(fd, hello.data(), hello.size(), deadline, what);
  std::array<uint8_t, 64> challenge{};
  recv_or_throw(fd, challenge.data(), challenge.size(), deadline, what,
                "the peer closed the connection during the handshake (not a keel server of "
                "this job?)");
  const Mac k = channel_key(key, channel);
  const Mac expect = proof(k, "server", hello.data() + 8, challenge.data());
  if (crypto_verify_32(expect.data(), challenge.data() + 32) != 0)
    throw AuthError(what + ": the peer does not hold this job's key (or serves another " +
                    channel.purpose + " epoch)");
  const Mac mine = proof(k, "client", hello.data() + 8, challenge.data());
  send_or_throw(fd, mine.data(), mine.size(), deadline, what);
  uint8_t ok = 0;
  recv_or_throw(fd, &ok, 1, deadline, what, "refused by the peer: it does not accept our key");
  if (ok != kAccepted) throw AuthError(what + ": refused by the peer");
  return session_keys(k, hello.data() + 8, challenge.data());
}

ServerHandshake::ServerHandshake(AuthChannel channel, const JobKey& key)
    : channel_(std::move(channel)), mac_key_(channel_key(key, channel_)) {}

ServerHandshake::State ServerHandshake::refuse(int fd, const std::string& why) {
  why_ = why;
  state_ = State::kRefused;
  g_refusals.fetch_add(1);
  log_refusal(
      detail::concat("a ", channel_.purpose, " connection from ", peer_address(fd), ": ", why));
  return state_;
}

ServerHandshake::State ServerHandshake::pump(int fd) {
  while (state_ == State::kPending) {
    uint8_t* dst = challenged_ ? proof_.data() + got_ : hello_.data() + got_;
    const size_t want = (challenged_ ? proof_.size() : hello_.size()) - got_;
    ssize_t n = ::recv(fd, dst, want, MSG_DONTWAIT);
    if (n == 0) return refuse(fd, "closed during the handshake");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return state_;
      if (errno == EINTR) continue;
      return refuse(fd, std::string("handshake: ") + std::strerror(errno));
    }
    // The magic is checked as soon as it is in, so random bytes cost nothing more.
    const size_t before = got_;
    got_ += static_cast<size_t>(n);
    if (!challenged_ && before < 8 &&
        std::memcmp(hello_.data(), kMagic, std::min<size_t>(got_, 8)) != 0)
      return refuse(fd, "not a keel handshake");
    if (!challenged_ && got_ == hello_.size()) {
      randombytes_buf(server_nonce_.data(), server_nonce_.size());
      std::array<uint8_t, 64> challenge{};
      std::memcpy(challenge.data(), server_nonce_.data(), 32);
      const Mac m = proof(mac_key_, "server", hello_.data() + 8, server_nonce_.data());
      std::memcpy(challenge.data() + 32, m.data(), 32);
      // 64 bytes on a fresh connection: the socket buffer always takes them at once.
      if (::send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL | MSG_DONTWAIT) != 64)
        return refuse(fd, "could not send the challenge");
      challenged_ = true;
      got_ = 0;
    } else if (challenged_ && got_ == proof_.size()) {
      const Mac expect = proof(mac_key_, "client", hello_.data() + 8, server_nonce_.data());
      if (crypto_verify_32(expect.data(), proof_.data()) != 0)
        return refuse(fd, "wrong key (not this job's, or another " + channel_.purpose +
                              " epoch, or a replayed handshake)");
      if (::send(fd, &kAccepted, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1)
        return refuse(fd, "could not send the acceptance");
      keys_ = session_keys(mac_key_, hello_.data() + 8, server_nonce_.data());
      state_ = State::kDone;
    }
  }
  return state_;
}

SessionKeys authenticate_client(int fd, const AuthChannel& channel, Clock::time_point deadline,
                                const std::string& what, const JobKey& key) {
  ServerHandshake hs(channel, key);
  while (hs.pump(fd) == ServerHandshake::State::kPending) {
    const int ms = detail::poll_ms_left(deadline);
    if (ms == 0) throw CommTimeout(what + ": the peer did not complete the handshake in time");
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) < 0 && errno != EINTR)
      throw CommError(what + ": poll: " + std::strerror(errno));
  }
  if (hs.state() == ServerHandshake::State::kRefused) throw AuthError(what + ": " + hs.why());
  return hs.keys();
}

int64_t auth_refusals() {
  return g_refusals.load();
}

void note_refusal(const std::string& text) {
  g_refusals.fetch_add(1);
  log_refusal(text);
}

}  // namespace keel
