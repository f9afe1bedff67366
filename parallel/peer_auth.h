// The handshake every TCP connection keel accepts starts with (the rendezvous store, backup
// servers, socket communicators): a mutual challenge-response on the job's key
// (parallel/job_key.h), over fresh nonces from both sides, bound to what the connection is
// for (its purpose and epoch). A peer without the key, a handshake captured from another
// connection and replayed, one of another job or of an old epoch: each is refused before a
// byte of the protocol behind it is read.
//
//   client -> server  "KEELHS01" | client nonce (32)
//   server -> client  server nonce (32) | HMAC(K, "server" | nonces)
//   client -> server  HMAC(K, "client" | nonces)
//   server -> client  1 byte: accepted
//   K = HMAC(job key, "keel-handshake/1" | purpose | epoch)
//
// The server proves the key first, so a client never sends its proof to an impostor.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "parallel/comm_error.h"
#include "parallel/job_key.h"

namespace keel {

// A peer that does not hold the job's key, or answered for another purpose or epoch.
class AuthError : public CommError {
 public:
  explicit AuthError(const std::string& what) : CommError(what) {}
};

// What a connection is for. A communicator's connections carry their epoch, so a peer of
// an epoch that ended cannot join the next one's mesh.
struct AuthChannel {
  std::string purpose;  // "store", "backup", "comm"
  int64_t epoch = 0;
};

// Limits of a server's connections still at the handshake: how long one may take, and how
// many may wait at once (the oldest goes), so that connections that never prove the key
// neither hold descriptors nor crowd out the job's own.
inline constexpr std::chrono::seconds kHandshakeTimeout{10};
inline constexpr ptrdiff_t kMaxPendingHandshakes = 256;

// The client side, blocking until `deadline` on a connected non-blocking socket. Throws
// AuthError (naming `what`) if the server does not prove the key or refuses ours, CommTimeout
// if it does not answer in time.
void authenticate_to_server(int fd, const AuthChannel& channel,
                            std::chrono::steady_clock::time_point deadline, const std::string& what,
                            const JobKey& key = process_job_key());

// The server side of one accepted connection, driven by a poll loop: call pump() whenever the
// socket is readable. Never blocks; reads no byte beyond the handshake.
class ServerHandshake {
 public:
  enum class State { kPending, kDone, kRefused };

  ServerHandshake(AuthChannel channel, const JobKey& key = process_job_key());

  // Reads what has arrived and answers. kRefused: close the connection (the refusal is
  // already counted and logged, rate-limited, with the peer's address and why).
  State pump(int fd);
  State state() const { return state_; }
  const std::string& why() const { return why_; }

 private:
  State refuse(int fd, const std::string& why);

  AuthChannel channel_;
  std::array<uint8_t, 32> mac_key_{};
  std::array<uint8_t, 40> hello_{};
  std::array<uint8_t, 32> server_nonce_{};
  std::array<uint8_t, 32> proof_{};
  size_t got_ = 0;  // bytes of hello_ then proof_ received
  bool challenged_ = false;
  State state_ = State::kPending;
  std::string why_;
};

// The server side, blocking until `deadline` (for servers that take one connection at a
// time, e.g. a communicator's mesh). Throws AuthError naming `what` on a refusal.
void authenticate_client(int fd, const AuthChannel& channel,
                         std::chrono::steady_clock::time_point deadline, const std::string& what,
                         const JobKey& key = process_job_key());

// Connections this process refused since it started.
int64_t auth_refusals();

}  // namespace keel
