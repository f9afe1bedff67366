// What a connection carries after its handshake (parallel/peer_auth.h): sealed with
// AES-256-GCM under the connection's session keys when its two ends are on different
// machines, so that a snapshot or a parameter that crosses the network can be neither read
// nor altered on the way; as it is on one machine, where no byte leaves the host (loopback,
// or a machine's own address) and sealing would only cost.
//
// Record format, one per send() of up to kMaxRecord bytes (longer sends are split):
//   length (4 bytes, little-endian; the AEAD's associated data) | ciphertext | tag (16)
// Nonce: the record's number on its direction (8 bytes) after 4 zero bytes; each direction
// has a key of its own, so a nonce is never used twice under one key. A record that fails its
// tag — altered, replayed, reordered, or from another connection — ends the connection and
// is counted and logged as a refusal.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/peer_auth.h"
#include "parallel/socket_util.h"
#include "proto/config.pb.h"

namespace keel {

// When connections are sealed (the job's security.encrypt): every process of a job holds the
// same policy, and both ends of a connection decide alike from its two addresses.
enum class SealPolicy {
  kBetweenMachines,  // the default
  kAlways,           // loopback too: what the tests and keel-bench restore compare
  kNever,            // authenticated at the start only (a network the operator trusts)
};
// This process's policy. Set at start-up, before any connection.
void set_seal_policy(SealPolicy p);
SealPolicy seal_policy();
// "between_machines", "always", "never".
const char* seal_policy_name(SealPolicy p);
// The policy a job's security.encrypt asks for.
SealPolicy seal_policy_of(const config::SecurityConfig& c);

// Whether both ends of connected socket `fd` are on this machine: both addresses loopback,
// or the same address. Both ends of a connection answer alike.
bool same_machine(int fd);
// Whether `policy` seals connection `fd`.
bool seals(int fd, SealPolicy policy = seal_policy());

// Sets OpenSSL up and finds its AES-256-GCM, once a process; sealing does it on first use.
// Call it before fork() in a process whose other threads may seal: OpenSSL 3 sets itself up
// under locks that a child forked meanwhile inherits held and waits on forever (a test's
// rank hung so, forked while the parent's store thread sealed its first connection).
void prepare_sealing();

// One direction's AES-256-GCM under one session key, record by record; the records'
// numbers are its nonces. For a caller with a non-blocking transport of its own (the socket
// communicator); SealedChannel is the blocking one.
class RecordCipher {
 public:
  static constexpr size_t kHeaderBytes = 4;  // the record's length, little-endian
  static constexpr size_t kTagBytes = 16;

  // `seal`: this end writes the records; else it reads them.
  RecordCipher(const std::array<uint8_t, 32>& key, bool seal);
  ~RecordCipher();
  RecordCipher(const RecordCipher&) = delete;
  RecordCipher& operator=(const RecordCipher&) = delete;

  // Writes the record of `n` bytes of `in` to `out` (room for n + kHeaderBytes + kTagBytes).
  void seal(const void* in, size_t n, uint8_t* out);
  // The length a record's header claims.
  static size_t length(const uint8_t* header);
  // Opens the record of `header`: its `n` bytes of ciphertext at `body`, in place, and its
  // `tag`. False if it fails its check (the bytes at `body` are then garbage).
  bool open(const uint8_t* header, uint8_t* body, size_t n, const uint8_t* tag);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One connected socket's byte stream, sealed or plain as seals() decides; the socket is
// borrowed. send() and recv() behave as detail::send_all / recv_all, and a record that fails
// its check is kClosed with `err` saying so. One sender and one receiver at a time.
class SealedChannel {
 public:
  static constexpr size_t kMaxRecord = size_t{1} << 20;

  SealedChannel();  // a closed channel
  // `client`: this end made the connection (it sends with keys.to_server).
  SealedChannel(int fd, const SessionKeys& keys, bool client, SealPolicy policy = seal_policy());
  ~SealedChannel();
  SealedChannel(SealedChannel&&) noexcept;
  SealedChannel& operator=(SealedChannel&&) noexcept;

  int fd() const { return fd_; }
  bool sealed() const { return out_ != nullptr; }

  detail::IoResult send(const void* buf, size_t len, detail::Clock::time_point deadline,
                        std::string* err);
  detail::IoResult recv(void* buf, size_t len, detail::Clock::time_point deadline,
                        std::string* err);

 private:
  // Reads one record; `dst` (room for `room` bytes) takes it when it fits, else the held
  // buffer does.
  detail::IoResult recv_record(char* dst, size_t room, size_t* got,
                               detail::Clock::time_point deadline, std::string* err);

  int fd_ = -1;
  std::unique_ptr<RecordCipher> out_, in_;
  std::vector<char> wire_;  // one sealed record on its way out
  std::vector<char> held_;  // a record's plaintext that recv() has not taken yet
  size_t held_pos_ = 0, held_end_ = 0;
};

}  // namespace keel
