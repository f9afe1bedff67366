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
// The server proves the key first, so a client never sends its proof to an impostor. Both
// ends then hold fresh session keys, one per direction (HMAC(K, "to server"/"to client" |
// nonces)), which seal what the connection carries afterwards (parallel/sealed_channel.h).
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

// A connection's session keys, fresh for each connection: a record sealed on one connection
// opens on no other.
struct SessionKeys {
  std::array<uint8_t, 32> to_server{};
  std::array<uint8_t, 32> to_client{};
};

// Limits of a server's connections still at the handshake: how long one may take, and how
// many may wait at once (the oldest goes), so that connections that never prove the key
// neither hold descriptors nor crowd out the job's own.
inline constexpr std::chrono::seconds kHandshakeTimeout{10};
inline constexpr ptrdiff_t kMaxPendingHandshakes = 256;

// The client side, blocking until `deadline` on a connected non-blocking socket. Throws
// AuthError (naming `what`) if the server does not prove the key or refuses ours, CommTimeout
// if it does not answer in time. Returns the connection's session keys.
SessionKeys authenticate_to_server(int fd, const AuthChannel& channel,
                                   std::chrono::steady_clock::time_point deadline,
                                   const std::string& what, const JobKey& key = process_job_key());

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
  // The session keys, once kDone.
  const SessionKeys& keys() const { return keys_; }

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
  SessionKeys keys_;
};

// The server side, blocking until `deadline` (for servers that take one connection at a
// time, e.g. a communicator's mesh). Throws AuthError naming `what` on a refusal. Returns
// the connection's session keys.
SessionKeys authenticate_client(int fd, const AuthChannel& channel,
                                std::chrono::steady_clock::time_point deadline,
                                const std::string& what, const JobKey& key = process_job_key());

// Connections this process refused since it started (a sealed record that fails its check
// counts too).
int64_t auth_refusals();
// Counts a refusal found after the handshake and logs `text` ("a backup connection from
// ...: ..."), rate-limited like the handshake's own.
void note_refusal(const std::string& text);
// The peer of a connected socket, "host:port" ("an unknown peer" if it cannot be read).
std::string peer_address(int fd);

}  // namespace keel
