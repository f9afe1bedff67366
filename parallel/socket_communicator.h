// The CPU data plane: a Communicator over plain TCP sockets, one connection per pair of
// ranks, rendezvous through a Store.
//
// Why not Gloo: Debian's Gloo (0.0~git20220518) cannot abort a pending collective from
// another thread (only UnboundBuffer::abortWaitRecv exists, and gloo::allreduce does not
// expose it), so it cannot meet Communicator's abort contract. Here every wait is a poll()
// that also watches an eventfd, so abort() wakes it from any thread.
//
// Collectives use fixed ring algorithms (all_reduce = ring reduce-scatter + ring all-gather),
// so a reduction adds in the same order on every run, and every rank ends with the bits its
// chunk's owner computed.
#pragma once

#include <atomic>

#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/store.h"

namespace keel {

struct SocketCommOptions {
  std::string name;        // group name incl. epoch, e.g. "0/tp.dp1.pp0"; the store key prefix
  int rank = 0, size = 1;  // within the group
  Millis timeout{60000};   // default per-call timeout (also for connection set-up)
  std::string host = "127.0.0.1";  // address to listen on and publish
  // Set (from any thread) to end the rendezvous at once with CommAborted: the job moved to
  // another epoch while this group was still being built.
  const std::atomic<bool>* cancel = nullptr;
};

// Builds the group's full mesh: listens on an ephemeral port, publishes "host:port" under
// "<name>/addr/<rank>", connects to every higher rank and accepts every lower one. Each
// connection starts with a handshake of (name, rank, size), and a connection from another
// group or epoch is refused. Returns once connected to every peer; throws CommTimeout if
// that takes longer than opts.timeout, CommError if a peer refuses. A size-1 group opens no
// socket and its calls do nothing.
//
// After a call throws, peers blocked on this rank learn of it only when this communicator
// is aborted or destroyed (which closes its connections): call abort() on any CommError.
std::unique_ptr<Communicator> make_socket_communicator(std::shared_ptr<Store> store,
                                                       const SocketCommOptions& opts);

}  // namespace keel
