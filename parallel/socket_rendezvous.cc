#include "parallel/socket_rendezvous.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "parallel/peer_auth.h"
#include "parallel/tcp_store.h"
#include "runtime/check.h"

namespace keel::detail {
namespace {

constexpr uint32_t kMagic = 0x4c45454b;  // "KEEL"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxName = 4096;
constexpr char kAccept = 1;
constexpr char kRefuse = 2;

// The first bytes on every connection, followed by the group name. Sent in host byte order:
// a group runs on machines of one architecture.
struct Hello {
  uint32_t magic, version, from_rank, to_rank, size, name_len;
};
static_assert(sizeof(Hello) == 24);
static_assert(std::endian::native == std::endian::little);

std::string addr_key(const SocketCommOptions& o, int rank) {
  return concat(o.name, "/addr/", rank);
}

// The job-key handshake of a connection of this group: its name holds the epoch, so a peer
// of another group or epoch cannot complete it.
AuthChannel mesh_channel(const SocketCommOptions& o) {
  return {"comm " + o.name, 0};
}

std::chrono::milliseconds ms_left(Clock::time_point deadline) {
  return std::chrono::milliseconds(poll_ms_left(deadline));
}

// A rendezvous waits in slices of this, so that a cancel (a new epoch began while this one
// was still being built) ends it promptly instead of at its timeout.
constexpr auto kCancelSlice = std::chrono::milliseconds(100);

void throw_if_cancelled(const SocketCommOptions& o) {
  if (o.cancel && o.cancel->load())
    throw CommAborted(concat(o.name, ": rank ", o.rank, ": rendezvous aborted"));
}

// Waits in slices for `fn(slice_deadline)`, which throws CommTimeout when a slice passes.
template <typename Fn>
auto cancellable(const SocketCommOptions& o, Clock::time_point deadline, Fn fn) {
  while (true) {
    throw_if_cancelled(o);
    const auto slice = std::min(deadline, Clock::now() + kCancelSlice);
    try {
      return fn(slice);
    } catch (const CommTimeout&) {
      if (Clock::now() >= deadline) throw;
    }
  }
}

MeshPeer connect_peer(Store& store, const SocketCommOptions& o, int peer,
                      Clock::time_point deadline) {
  std::string addr = cancellable(
      o, deadline, [&](Clock::time_point d) { return store.get(addr_key(o, peer), ms_left(d)); });
  auto [host, port] = parse_host_port(addr);
  std::string who = concat("rank ", peer, " of ", o.name);
  Fd fd = cancellable(o, deadline,
                      [&](Clock::time_point d) { return connect_tcp(host, port, d, who); });
  const SessionKeys keys =
      authenticate_to_server(fd.get(), mesh_channel(o), deadline,
                             concat(o.name, ": rank ", o.rank, ": ", who, " at ", addr));
  Hello h{kMagic,
          kVersion,
          static_cast<uint32_t>(o.rank),
          static_cast<uint32_t>(peer),
          static_cast<uint32_t>(o.size),
          static_cast<uint32_t>(o.name.size())};
  std::string msg(reinterpret_cast<const char*>(&h), sizeof(h));
  msg += o.name;
  std::string err;
  char answer = 0;
  IoResult res = send_all(fd.get(), msg.data(), msg.size(), deadline, &err);
  if (res == IoResult::kOk) res = recv_all(fd.get(), &answer, 1, deadline, &err);
  if (res == IoResult::kTimeout)
    throw CommTimeout(concat(o.name, ": rank ", o.rank, ": ", who, " at ", addr,
                             " did not answer the handshake within the timeout"));
  if (res == IoResult::kClosed)
    throw PeerFailure(concat(o.name, ": rank ", o.rank, ": ", who, " at ", addr,
                             " dropped the connection during the handshake: ", err),
                      peer);
  if (answer != kAccept)
    throw CommError(concat(o.name, ": rank ", o.rank, ": the listener at ", addr,
                           " refused the handshake: it is not ", who,
                           " (a stale address of another group or epoch?)"));
  return {std::move(fd), keys, true};
}

// An accepted connection whose handshakes (the job key's, then the group's) have not
// fully arrived.
struct Incoming {
  Fd fd;
  ServerHandshake auth;
  std::string buf;
};

// Checks a complete handshake; returns the peer's rank, or -1 to refuse it.
int check_hello(const Incoming& in, const SocketCommOptions& o,
                const std::vector<MeshPeer>& peers) {
  Hello h;
  std::memcpy(&h, in.buf.data(), sizeof(h));
  bool ok = h.magic == kMagic && h.version == kVersion && h.size == uint32_t(o.size) &&
            h.to_rank == uint32_t(o.rank) && h.from_rank < uint32_t(o.rank) &&
            in.buf.compare(sizeof(h), std::string::npos, o.name) == 0;
  if (!ok || peers[h.from_rank].fd.valid()) return -1;
  return static_cast<int>(h.from_rank);
}

enum class HelloState { kPartial, kComplete, kDrop };

// Reads what has arrived of a handshake without blocking.
HelloState read_hello(Incoming& in) {
  for (;;) {
    size_t want = sizeof(Hello);
    if (in.buf.size() >= sizeof(Hello)) {
      Hello h;
      std::memcpy(&h, in.buf.data(), sizeof(h));
      if (h.magic != kMagic || h.name_len > kMaxName) return HelloState::kDrop;
      want += h.name_len;
    }
    if (in.buf.size() >= sizeof(Hello) && in.buf.size() == want) return HelloState::kComplete;
    char tmp[sizeof(Hello) + kMaxName];
    ssize_t n = ::recv(in.fd.get(), tmp, want - in.buf.size(), MSG_DONTWAIT);
    if (n > 0) {
      in.buf.append(tmp, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    bool again = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    return again ? HelloState::kPartial : HelloState::kDrop;
  }
}

void accept_peers(int listener, const SocketCommOptions& o, std::vector<MeshPeer>& peers,
                  Clock::time_point deadline) {
  std::vector<Incoming> pending;
  int connected = 0;
  std::vector<pollfd> pfds;
  while (connected < o.rank) {
    pfds.assign(1, {listener, POLLIN, 0});
    for (auto& in : pending) pfds.push_back({in.fd.get(), POLLIN, 0});
    throw_if_cancelled(o);
    int rc = ::poll(pfds.data(), pfds.size(),
                    poll_ms_left(std::min(deadline, Clock::now() + kCancelSlice)));
    if (rc < 0 && errno == EINTR) continue;
    KEEL_CHECK_ERRNO(rc);
    if (rc == 0 && Clock::now() < deadline) continue;
    if (rc == 0) {
      std::string missing;
      for (int j = 0; j < o.rank; ++j)
        if (!peers[j].fd.valid()) missing += concat(missing.empty() ? "" : ", ", j);
      throw CommTimeout(concat(o.name, ": rank ", o.rank, ": timed out waiting for rank(s) ",
                               missing, " to connect"));
    }
    for (size_t i = pending.size(); i-- > 0;) {
      if (!pfds[i + 1].revents) continue;
      Incoming& in = pending[i];
      ServerHandshake::State a = in.auth.pump(in.fd.get());
      if (a == ServerHandshake::State::kPending) continue;
      HelloState state = a == ServerHandshake::State::kDone ? read_hello(in) : HelloState::kDrop;
      if (state == HelloState::kPartial) continue;
      if (state == HelloState::kComplete) {
        int from = check_hello(in, o, peers);
        char answer = from >= 0 ? kAccept : kRefuse;
        // One byte on a fresh connection always fits in the send buffer.
        bool sent = ::send(in.fd.get(), &answer, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1;
        if (from >= 0 && sent) {
          peers[from] = {std::move(in.fd), in.auth.keys(), false};
          ++connected;
        }
      }
      pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
    }
    if (pfds[0].revents) {
      for (;;) {
        int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        pending.push_back({Fd(fd), ServerHandshake(mesh_channel(o)), {}});
      }
    }
  }
}

}  // namespace

std::vector<MeshPeer> connect_mesh(Store& store, const SocketCommOptions& o) {
  auto deadline = Clock::now() + o.timeout;
  Fd listener = listen_tcp(o.host, 0, std::max(o.size, 16));
  store.set(addr_key(o, o.rank), join_host_port(o.host, local_port(listener.get())));
  std::vector<MeshPeer> peers(static_cast<size_t>(o.size));
  // Connecting upwards before accepting cannot deadlock: the highest rank only accepts, and
  // every rank reaches its accept loop once all ranks above it have.
  for (int j = o.rank + 1; j < o.size; ++j) peers[j] = connect_peer(store, o, j, deadline);
  accept_peers(listener.get(), o, peers, deadline);
  for (auto& p : peers)
    if (p.fd.valid()) set_nodelay(p.fd.get());
  return peers;
}

}  // namespace keel::detail
