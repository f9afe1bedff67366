// The data plane: collectives and point-to-point over raw buffers of one group of ranks.
// Two backends implement it: plain TCP sockets for CPU memory (socket_communicator.h) and
// NCCL for CUDA memory (nccl_communicator.h). Both rendezvous through a Store under a key
// prefix that includes the job epoch.
//
// Contract shared by every backend (what the fault-tolerance layers rely on):
// - every call completes, or throws within its timeout: CommTimeout, PeerFailure (a peer
//   died or closed), or CommAborted (abort() was called);
// - abort() may be called from any thread at any time; every pending and later call on this
//   communicator then throws CommAborted promptly;
// - after any CommError the communicator is broken; build a new one;
// - reductions are deterministic: the same inputs on the same group give bitwise-identical
//   results on every run and on every rank.
// Calls on one communicator must come from one thread at a time (abort() excepted).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/comm_error.h"

namespace keel {

enum class ReduceOp { kSum, kMax };

using Millis = std::chrono::milliseconds;

// What a communicator moved since it was created, for per-step accounting.
struct CommStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double wait_s = 0;  // wall time spent inside calls
};

// What a communicator sent to one peer since it was created, for fail-slow detection
// (robust/slow_rules.h): a degraded link shows as sends that take long to leave.
struct LinkStats {
  int peer = -1;  // rank within the group
  uint64_t bytes_sent = 0;
  uint64_t sends = 0;  // messages
  double send_s = 0;   // summed over messages: from the start of the exchange that carried
                       // it until its last byte was handed to the transport
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // rank within this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // e.g. "3/tp/1", for messages

  // The timeout each call uses when it is not given one.
  virtual Millis default_timeout() const = 0;

  // In-place all-reduce of n floats.
  virtual void all_reduce(float* buf, size_t n, ReduceOp op = ReduceOp::kSum,
                          Millis timeout = Millis(0)) = 0;
  // buf holds size()·chunk floats; afterwards rank r's reduced chunk is at
  // buf[r·chunk, (r+1)·chunk) (other chunks are left unspecified).
  virtual void reduce_scatter(float* buf, size_t chunk, Millis timeout = Millis(0)) = 0;
  // buf holds size()·chunk floats; rank r's chunk at buf[r·chunk, ...) is sent to all.
  virtual void all_gather(float* buf, size_t chunk, Millis timeout = Millis(0)) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root, Millis timeout = Millis(0)) = 0;

  // Tagged point-to-point. Messages between a pair arrive in order; a receive whose tag or
  // size does not match the next message is a CommError (a protocol bug, not a fault).
  virtual void send(const void* buf, size_t bytes, int peer, uint32_t tag,
                    Millis timeout = Millis(0)) = 0;
  virtual void recv(void* buf, size_t bytes, int peer, uint32_t tag,
                    Millis timeout = Millis(0)) = 0;
  // Send to one peer and receive from another (or the same) at once, so two ranks that
  // exchange in opposite directions never deadlock (1F1B's send_forward_recv_backward).
  // A null send_buf or recv_buf skips that half.
  virtual void send_recv(const void* send_buf, size_t send_bytes, int send_peer, void* recv_buf,
                         size_t recv_bytes, int recv_peer, uint32_t tag,
                         Millis timeout = Millis(0)) = 0;

  virtual void barrier(Millis timeout = Millis(0)) = 0;

  // Thread-safe; idempotent. Makes pending and later calls throw CommAborted.
  virtual void abort() = 0;
  virtual bool aborted() const = 0;

  virtual CommStats stats() const = 0;
  // Per peer, for the transports that can tell (sockets); empty otherwise.
  virtual std::vector<LinkStats> link_stats() const { return {}; }
};

}  // namespace keel
