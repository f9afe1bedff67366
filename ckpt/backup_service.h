// Peer backups of snapshots (DESIGN.md, Checkpoints). The holder rank's worker runs a
// BackupServer; the owner's Snapshotter pushes each committed snapshot to it with a
// BackupClient, and a restore (or a promoted standby) fetches from it. The server keeps the
// owner's newest two snapshots in the shared-memory segment backup_segment_name(job, holder)
// with the same two-slot write protocol as the owner's own region, so the backups survive a
// restart of the holder's worker: a new BackupServer reopens the segment and serves them.
//
// Every transfer is checksummed end to end (ckpt/checksum.h of the payload as the owner
// committed it) by its receiver, and bounded by deadlines: a dead or stalled peer costs a
// dropped connection, never a hang. A connection proves the job's key first
// (parallel/peer_auth.h), and between machines everything it carries is sealed
// (parallel/sealed_channel.h): a snapshot crossing the network can be neither read nor
// altered.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "parallel/sealed_channel.h"
#include "parallel/socket_util.h"
#include "runtime/check.h"

namespace keel {

class SnapshotRegion;
class TrainState;

// A backup transfer failed: the peer is unreachable, died, stalled past the timeout, or
// refused the request (the message says which). The client reconnects on its next call.
class BackupError : public Error {
 public:
  explicit BackupError(const std::string& what) : Error(what) {}
};

struct BackupServerOptions {
  std::string host = "127.0.0.1";  // address to listen on
  int port = 0;                    // 0: an ephemeral port, read back with port()
  // How long one request may go without progress before its connection is dropped.
  std::chrono::milliseconds io_timeout{10000};
  // The holder is a DP replica of the ranks it backs up (ckpt/backup_placement.h): a FETCH
  // the backup segment cannot answer is served from the holder's own snapshot segment,
  // which holds the same state. Nothing is pushed in that mode.
  bool serve_own_snapshot = false;
};

// Serves PUSH and FETCH for the backups held by rank `holder_rank` from a background thread,
// and FETCH of `holder_rank`'s own snapshots (its snapshot segment, opened at first use).
class BackupServer {
 public:
  // Listens at once and reopens an existing backup segment of (job, holder_rank), if any
  // (one that is unreadable is reported, unlinked and started afresh). Throws keel::Error if
  // the address cannot be bound.
  BackupServer(const std::string& job, int holder_rank, BackupServerOptions options = {});
  ~BackupServer();  // stop()
  BackupServer(const BackupServer&) = delete;
  BackupServer& operator=(const BackupServer&) = delete;

  int port() const;
  std::string address() const;  // "host:port", what clients and set_backup_holder() take
  // Pushes committed / refused so far (refused: bad checksum, malformed request).
  int64_t pushes_committed() const;
  int64_t pushes_refused() const;
  // Closes every connection and joins the thread; the segment stays. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A connection to one BackupServer, made on first use and again after any failure. Not
// thread-safe: one caller at a time.
class BackupClient {
 public:
  // `addr` is "host:port". `timeout` bounds each stretch of a transfer without progress;
  // `connect_timeout` (default: `timeout`) how long refused connections are retried.
  explicit BackupClient(std::string addr,
                        std::chrono::milliseconds timeout = std::chrono::seconds(30),
                        std::chrono::milliseconds connect_timeout = std::chrono::milliseconds(0));
  ~BackupClient();

  const std::string& address() const { return addr_; }

  // Sends the committed slot of `region` holding `step` (owner, fingerprint and checksum from
  // its header); with `verified` its verified slot, which the holder keeps in its own
  // verified slot beside the newest backups. Returns the payload bytes sent. Throws
  // BackupError if the slot is not held or the transfer fails or the server refuses it.
  size_t push(const SnapshotRegion& region, int64_t step, bool verified = false);
  // Sends an arbitrary payload with the given claimed checksum (tests use a wrong one to
  // play a payload corrupted in flight). The server commits it only if the checksum matches.
  void push_raw(int owner_rank, int64_t step, uint64_t fingerprint, const void* payload,
                size_t bytes, uint64_t checksum, bool verified = false);
  // Loads the backup of `owner_rank` at `step` into `state`, verifying layout fingerprint,
  // size and checksum. The holder sends its slot as it is; the payload goes straight into
  // the state's memory (device memory through a bounded host buffer), checksummed as it
  // arrives, and only on a mismatch does the holder check its slot (dropping it if damaged,
  // so no survey offers the step again). Returns false with the reason if the server does
  // not hold the step or the layout differs (the state is then untouched), or the held slot
  // or the transfer was damaged (the state is then partly overwritten); throws BackupError if
  // the transfer fails (the state may be partly overwritten).
  // With `checksum`, a successful fetch stores there the checksum the state now has.
  bool fetch(int owner_rank, int64_t step, TrainState& state, std::string* why,
             uint64_t* checksum = nullptr);
  // Reads `bytes` of the payload of `owner_rank`'s copy of `step` from byte `offset` into
  // `out` (host memory): what a rank of another layout needs of it (ckpt/memory_reshard.h).
  // The holder checks its slot whole (once per slot) and the layout `fingerprint`; the range
  // is checksummed on its way. Returns false with the reason if the holder lacks the step or
  // refuses (another layout, a range beyond the payload, a damaged slot, now dropped) or the
  // range arrived damaged; throws BackupError if the transfer fails.
  bool fetch_range(int owner_rank, int64_t step, uint64_t fingerprint, size_t offset, size_t bytes,
                   void* out, std::string* why);

 private:
  void connect();
  [[noreturn]] void fail(const std::string& what);

  std::string addr_;
  std::chrono::milliseconds timeout_, connect_timeout_;
  detail::Fd fd_;
  SealedChannel ch_;  // over fd_: sealed when the holder is on another machine
};

}  // namespace keel
