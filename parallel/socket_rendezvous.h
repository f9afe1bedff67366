// Connection set-up for the socket communicator: the full mesh of one group, met through a
// Store. Internal to parallel/.
#pragma once

#include <vector>

#include "parallel/peer_auth.h"
#include "parallel/socket_communicator.h"
#include "parallel/socket_util.h"

namespace keel::detail {

// One peer's connection and the session keys its handshake made (parallel/peer_auth.h).
struct MeshPeer {
  Fd fd;
  SessionKeys keys;
  bool client = false;  // this end connected
};

// Returns one connected, non-blocking, TCP_NODELAY socket per peer, indexed by rank (the
// entry for opts.rank is empty). Lower ranks connect to higher ones; every connection opens
// with a handshake naming the group, both ranks and the size, and the accepting side refuses
// one that does not match (a stale address from another group or epoch). Throws CommTimeout
// when the mesh is not complete within opts.timeout, PeerFailure if a peer drops the
// connection during the handshake, CommError if a peer refuses it.
std::vector<MeshPeer> connect_mesh(Store& store, const SocketCommOptions& opts);

}  // namespace keel::detail
