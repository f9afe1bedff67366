// Sealed records on one connection for a caller that drives non-blocking sockets itself (the
// socket communicator's exchange loop): the same records as parallel/sealed_channel.h, sealed
// one at a time from the caller's buffers and opened one at a time into them. Internal to
// parallel/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/peer_auth.h"
#include "parallel/sealed_channel.h"

namespace keel::detail {

class SealedLink {
 public:
  // Records stay small so that two per peer (one each way) cost little memory in a group of
  // many peers, and a reduction can start on the first while the next is on the wire.
  static constexpr size_t kMaxRecord = size_t{256} << 10;

  enum class Progress { kDone, kAgain, kError };

  // `client`: this end made the connection.
  SealedLink(const SessionKeys& keys, bool client);

  // Sealed records still leaving: flush() them before sealing more.
  bool pending() const { return sent_ < wire_.size(); }
  // Seals `n` bytes (1..kMaxRecord) of `p` as the next record, after those pending: a
  // message's header and its first piece leave in one send.
  void seal(const void* p, size_t n);
  // Sends what is left of the pending records. kDone: all are out; kAgain: the socket is
  // full; kError: `err` says why.
  Progress flush(int fd, std::string* err);

  // The next record, once it is whole and its check passes: its plaintext goes to `dst`
  // (room for `room` bytes; a longer record is an error). kDone: `got` bytes landed; kAgain:
  // not all of it has arrived; kError: closed, failed, or failed its check (counted and
  // logged as a refusal). What arrives beyond the record is kept for the next call, which a
  // caller makes before it waits for the socket again.
  Progress recv_record(int fd, void* dst, size_t room, size_t* got, std::string* err);

 private:
  RecordCipher out_, in_;
  std::vector<uint8_t> wire_;  // the records leaving
  size_t sent_ = 0;
  std::vector<uint8_t> rec_;  // what has arrived: [begin_, end_) not yet taken
  size_t begin_ = 0, end_ = 0;
};

}  // namespace keel::detail
