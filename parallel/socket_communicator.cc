// Every message on a connection is a 16-byte header (kind, tag, payload bytes) and the
// payload. The receiver knows what it expects and checks the header, so two ranks that
// disagree about the call sequence fail with a message instead of corrupting buffers.
//
// All waiting happens in exchange(): non-blocking sockets and one poll() over the sockets
// of the transfers in flight plus an eventfd that abort() writes, bounded by the call's
// deadline. A collective step's send and receive progress together, so ranks that send to
// each other at once never deadlock.
//
// A connection that crosses machines is sealed (parallel/sealed_channel.h): the header and
// the payload go as AES-256-GCM records (parallel/sealed_link.h), a header in a record of
// its own, the payload in records of at most 256 KiB, each opened before its bytes count.
#include "parallel/socket_communicator.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <exception>
#include <span>
#include <thread>
#include <vector>

#include "parallel/link_delay.h"
#include "parallel/sealed_link.h"
#include "parallel/socket_rendezvous.h"
#include "parallel/socket_util.h"
#include "runtime/check.h"

namespace keel {
namespace {

using detail::Clock;
using detail::concat;
using detail::Fd;

enum Kind : uint32_t {
  kP2P = 1,
  kAllReduce = 2,
  kReduceScatter = 3,
  kAllGather = 4,
  kBroadcast = 5,
  kBarrier = 6
};

const char* kind_name(uint32_t k) {
  switch (k) {
    case kP2P:
      return "send";
    case kAllReduce:
      return "all_reduce";
    case kReduceScatter:
      return "reduce_scatter";
    case kAllGather:
      return "all_gather";
    case kBroadcast:
      return "broadcast";
    case kBarrier:
      return "barrier";
    default:
      return "unknown";
  }
}

struct Header {
  uint32_t kind = 0, tag = 0;
  uint64_t bytes = 0;
  bool operator==(const Header&) const = default;
};
static_assert(sizeof(Header) == 16);
static_assert(std::endian::native == std::endian::little);

// One direction of one message in flight.
struct Xfer {
  int peer = -1;
  bool is_send = false;
  Header hdr;  // what is sent, or what the receiver expects
  char* data = nullptr;
  Header got;  // as received
  size_t hdr_done = 0, done = 0;
  // A receive that reduces its payload (floats) into reduce_into as it arrives, so the
  // reduction overlaps the network instead of following it.
  float* reduce_into = nullptr;
  ReduceOp op = ReduceOp::kSum;
  size_t reduced = 0;  // floats already reduced
  // On a sealed connection: the header and payload bytes of the records in flight.
  size_t sealing_hdr = 0, sealing_data = 0;

  bool complete() const { return hdr_done == sizeof(Header) && done == hdr.bytes; }
};

Xfer make_send(int peer, Header h, const void* data) {
  Xfer x;
  x.peer = peer;
  x.is_send = true;
  x.hdr = h;
  x.data = static_cast<char*>(const_cast<void*>(data));
  return x;
}

Xfer make_recv(int peer, Header h, void* data) {
  Xfer x;
  x.peer = peer;
  x.hdr = h;
  x.data = static_cast<char*>(data);
  return x;
}

void reduce_span(float* dst, const float* src, size_t n, ReduceOp op) {
  if (op == ReduceOp::kSum) {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  } else {
    // NaN wins, so a diverged rank is seen by everyone.
    for (size_t i = 0; i < n; ++i) {
      float a = dst[i], b = src[i];
      dst[i] = (b > a || b != b) ? b : a;
    }
  }
}

class SocketCommunicator final : public Communicator {
 public:
  SocketCommunicator(std::vector<detail::MeshPeer> mesh, const SocketCommOptions& o)
      : name_(o.name), rank_(o.rank), size_(o.size), timeout_(o.timeout), links_(size_t(size_)) {
    for (detail::MeshPeer& p : mesh) {
      seal_.push_back(p.fd.valid() && seals(p.fd.get())
                          ? std::make_unique<detail::SealedLink>(p.keys, p.client)
                          : nullptr);
      peers_.push_back(std::move(p.fd));
    }
    if (size_ > 1) {
      abort_fd_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      KEEL_CHECK_ERRNO(abort_fd_.get());
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  Millis default_timeout() const override { return timeout_; }

  void all_reduce(float* buf, size_t n, ReduceOp op, Millis timeout) override {
    KEEL_CHECK(buf || n == 0, name_, ": all_reduce of a null buffer");
    call("all_reduce", timeout, [&](Clock::time_point deadline) {
      if (size_ == 1 || n == 0) return;
      std::vector<size_t> offs(size_ + 1);
      for (int c = 0; c <= size_; ++c) offs[c] = n * c / size_;
      ring_reduce_scatter(buf, offs, op, kAllReduce, deadline);
      ring_all_gather(buf, offs, kAllReduce, size_ - 1, deadline);
    });
  }

  void reduce_scatter(float* buf, size_t chunk, Millis timeout) override {
    KEEL_CHECK(buf || chunk == 0, name_, ": reduce_scatter of a null buffer");
    call("reduce_scatter", timeout, [&](Clock::time_point deadline) {
      if (size_ == 1) return;
      ring_reduce_scatter(buf, even_offsets(chunk), ReduceOp::kSum, kReduceScatter, deadline);
    });
  }

  void all_gather(float* buf, size_t chunk, Millis timeout) override {
    KEEL_CHECK(buf || chunk == 0, name_, ": all_gather of a null buffer");
    call("all_gather", timeout, [&](Clock::time_point deadline) {
      if (size_ == 1) return;
      ring_all_gather(buf, even_offsets(chunk), kAllGather, 0, deadline);
    });
  }

  void broadcast(void* buf, size_t bytes, int root, Millis timeout) override {
    KEEL_CHECK(root >= 0 && root < size_, name_, ": broadcast root ", root, " of ", size_);
    KEEL_CHECK(buf || bytes == 0, name_, ": broadcast of a null buffer");
    call("broadcast", timeout, [&](Clock::time_point deadline) {
      if (size_ == 1) return;
      // Binomial tree rooted at `root`: log2(size) rounds instead of size-1 sends from root.
      const int vr = (rank_ - root + size_) % size_;
      const Header h{kBroadcast, static_cast<uint32_t>(root), bytes};
      int mask = 1;
      for (; mask < size_; mask <<= 1) {
        if (vr & mask) {
          Xfer x = make_recv((vr - mask + root) % size_, h, buf);
          exchange({&x, 1}, deadline, "broadcast");
          break;
        }
      }
      std::vector<Xfer> sends;
      for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < size_) sends.push_back(make_send((vr + mask + root) % size_, h, buf));
      exchange(sends, deadline, "broadcast");
    });
  }

  void send(const void* buf, size_t bytes, int peer, uint32_t tag, Millis timeout) override {
    send_recv(buf, bytes, peer, nullptr, 0, -1, tag, timeout);
  }

  void recv(void* buf, size_t bytes, int peer, uint32_t tag, Millis timeout) override {
    send_recv(nullptr, 0, -1, buf, bytes, peer, tag, timeout);
  }

  void send_recv(const void* send_buf, size_t send_bytes, int send_peer, void* recv_buf,
                 size_t recv_bytes, int recv_peer, uint32_t tag, Millis timeout) override {
    if (send_buf) check_peer(send_peer);
    if (recv_buf) check_peer(recv_peer);
    const char* what = send_buf && recv_buf ? "send_recv" : send_buf ? "send" : "recv";
    call(what, timeout, [&](Clock::time_point deadline) {
      Xfer xs[2];
      size_t n = 0;
      if (send_buf) xs[n++] = make_send(send_peer, {kP2P, tag, send_bytes}, send_buf);
      if (recv_buf) xs[n++] = make_recv(recv_peer, {kP2P, tag, recv_bytes}, recv_buf);
      exchange({xs, n}, deadline, what);
    });
  }

  void barrier(Millis timeout) override {
    call("barrier", timeout, [&](Clock::time_point deadline) {
      // Dissemination barrier: after round k every rank has heard, directly or not, from
      // the 2^(k+1) ranks before it.
      uint32_t round = 0;
      for (int k = 1; k < size_; k <<= 1, ++round) {
        Xfer xs[2] = {make_send((rank_ + k) % size_, {kBarrier, round, 0}, nullptr),
                      make_recv((rank_ - k + size_) % size_, {kBarrier, round, 0}, nullptr)};
        exchange(xs, deadline, "barrier");
      }
    });
  }

  void abort() override {
    if (aborted_.exchange(true)) return;
    if (abort_fd_.valid()) {
      uint64_t one = 1;
      // The eventfd stays readable, so every later poll() wakes at once too.
      [[maybe_unused]] ssize_t n = ::write(abort_fd_.get(), &one, sizeof(one));
    }
    // Shut down rather than close: a poll() on another thread may still hold these fds,
    // and shutdown makes peers blocked on us see end of stream (PeerFailure) right away.
    for (auto& fd : peers_)
      if (fd.valid()) ::shutdown(fd.get(), SHUT_RDWR);
  }

  bool aborted() const override { return aborted_.load(); }

  CommStats stats() const override {
    CommStats s;
    s.bytes_sent = bytes_sent_.load();
    s.bytes_received = bytes_received_.load();
    s.wait_s = static_cast<double>(wait_ns_.load()) * 1e-9;
    return s;
  }

  std::vector<LinkStats> link_stats() const override {
    std::vector<LinkStats> out;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const Link& l = links_[size_t(p)];
      LinkStats ls;
      ls.peer = p;
      ls.bytes_sent = l.bytes.load();
      ls.sends = l.sends.load();
      ls.send_s = static_cast<double>(l.send_ns.load()) * 1e-9;
      out.push_back(ls);
    }
    return out;
  }

 private:
  // Runs one call: refuses it on a broken or aborted communicator, gives it its deadline,
  // breaks the communicator if it fails, and accounts its time.
  template <typename Body>
  void call(const char* what, Millis timeout, Body&& body) {
    if (aborted_.load()) throw CommAborted(concat(name_, ": ", what, ": communicator aborted"));
    if (error_) std::rethrow_exception(error_);
    auto t0 = Clock::now();
    auto deadline = t0 + (timeout.count() > 0 ? timeout : timeout_);
    struct Account {
      std::atomic<int64_t>& ns;
      Clock::time_point t0;
      ~Account() { ns += std::chrono::nanoseconds(Clock::now() - t0).count(); }
    } account{wait_ns_, t0};
    try {
      body(deadline);
    } catch (const CommError&) {
      error_ = std::current_exception();
      throw;
    } catch (const std::exception& e) {
      // Anything else mid-protocol (a failed syscall) leaves the streams in an unknown
      // state just the same.
      error_ = std::make_exception_ptr(CommError(concat(name_, ": ", what, ": ", e.what())));
      std::rethrow_exception(error_);
    }
  }

  void check_peer(int peer) const {
    KEEL_CHECK(peer >= 0 && peer < size_ && peer != rank_, name_, ": rank ", rank_,
               " cannot exchange with peer ", peer, " in a group of ", size_);
  }

  std::vector<size_t> even_offsets(size_t chunk) const {
    std::vector<size_t> offs(size_ + 1);
    for (int c = 0; c <= size_; ++c) offs[c] = chunk * c;
    return offs;
  }

  int mod(int v) const { return ((v % size_) + size_) % size_; }

  // After step s of size-1 steps, chunk (rank - s - 2) has s + 2 ranks' contributions, so
  // rank r ends owning the fully reduced chunk r. Chunk c spans floats [offs[c], offs[c+1]).
  // Each chunk is summed in ring order starting at rank c+1, the same order on every run.
  void ring_reduce_scatter(float* buf, const std::vector<size_t>& offs, ReduceOp op, Kind kind,
                           Clock::time_point deadline) {
    size_t biggest = 0;
    for (int c = 0; c < size_; ++c) biggest = std::max(biggest, offs[c + 1] - offs[c]);
    if (scratch_.size() < biggest) scratch_.resize(biggest);
    const int right = mod(rank_ + 1), left = mod(rank_ - 1);
    for (int s = 0; s + 1 < size_; ++s) {
      const int sc = mod(rank_ - s - 1), rc = mod(rank_ - s - 2);
      const uint32_t tag = static_cast<uint32_t>(s);
      Xfer xs[2] = {
          make_send(right, {kind, tag, (offs[sc + 1] - offs[sc]) * sizeof(float)}, buf + offs[sc]),
          make_recv(left, {kind, tag, (offs[rc + 1] - offs[rc]) * sizeof(float)}, scratch_.data())};
      xs[1].reduce_into = buf + offs[rc];
      xs[1].op = op;
      exchange(xs, deadline, kind_name(kind));
    }
  }

  // Rank r starts owning chunk r; after size-1 steps everyone has every chunk.
  void ring_all_gather(float* buf, const std::vector<size_t>& offs, Kind kind, int tag_base,
                       Clock::time_point deadline) {
    const int right = mod(rank_ + 1), left = mod(rank_ - 1);
    for (int s = 0; s + 1 < size_; ++s) {
      const int sc = mod(rank_ - s), rc = mod(rank_ - s - 1);
      const uint32_t tag = static_cast<uint32_t>(tag_base + s);
      Xfer xs[2] = {
          make_send(right, {kind, tag, (offs[sc + 1] - offs[sc]) * sizeof(float)}, buf + offs[sc]),
          make_recv(left, {kind, tag, (offs[rc + 1] - offs[rc]) * sizeof(float)}, buf + offs[rc])};
      exchange(xs, deadline, kind_name(kind));
    }
  }

  [[noreturn]] void throw_aborted(const char* what) const {
    throw CommAborted(concat(name_, ": ", what, ": communicator aborted"));
  }

  [[noreturn]] void fail_peer(const Xfer& x, const char* what, const std::string& why) const {
    // Our own abort() shuts the sockets down; that must read as an abort, not a dead peer.
    if (aborted_.load()) throw_aborted(what);
    throw PeerFailure(concat(name_, ": rank ", rank_, ": ", what, ": connection to rank ", x.peer,
                             " failed while ", x.is_send ? "sending" : "receiving", ": ", why),
                      x.peer);
  }

  void progress_send(Xfer& x, const char* what) {
    const int fd = peers_[x.peer].get();
    if (seal_[size_t(x.peer)]) return progress_sealed_send(*seal_[size_t(x.peer)], x, what);
    while (!x.complete()) {
      iovec iov[2];
      int cnt = 0;
      if (x.hdr_done < sizeof(Header))
        iov[cnt++] = {reinterpret_cast<char*>(&x.hdr) + x.hdr_done, sizeof(Header) - x.hdr_done};
      if (x.done < x.hdr.bytes) iov[cnt++] = {x.data + x.done, x.hdr.bytes - x.done};
      msghdr mh{};
      mh.msg_iov = iov;
      mh.msg_iovlen = cnt;
      ssize_t n = ::sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        fail_peer(x, what, std::strerror(errno));
      }
      size_t left = static_cast<size_t>(n);
      size_t h = std::min(left, sizeof(Header) - x.hdr_done);
      x.hdr_done += h;
      left -= h;
      x.done += left;
      bytes_sent_ += left;
    }
  }

  // The same as progress_send on a sealed connection: records are sealed from the header
  // (with the payload's first piece, so that a small message is one send) or the payload,
  // and their bytes count once all of them have left.
  void progress_sealed_send(detail::SealedLink& link, Xfer& x, const char* what) {
    const int fd = peers_[x.peer].get();
    while (!x.complete()) {
      if (!link.pending()) {
        x.sealing_hdr = sizeof(Header) - x.hdr_done;
        if (x.sealing_hdr > 0)
          link.seal(reinterpret_cast<const char*>(&x.hdr) + x.hdr_done, x.sealing_hdr);
        x.sealing_data = std::min(detail::SealedLink::kMaxRecord, size_t(x.hdr.bytes) - x.done);
        if (x.sealing_data > 0) link.seal(x.data + x.done, x.sealing_data);
      }
      std::string err;
      const auto p = link.flush(fd, &err);
      if (p == detail::SealedLink::Progress::kAgain) return;
      if (p == detail::SealedLink::Progress::kError) fail_peer(x, what, err);
      x.hdr_done += x.sealing_hdr;
      x.done += x.sealing_data;
      bytes_sent_ += x.sealing_data;
      x.sealing_hdr = x.sealing_data = 0;
    }
  }

  void progress_recv(Xfer& x, const char* what) {
    const int fd = peers_[x.peer].get();
    detail::SealedLink* link = seal_[size_t(x.peer)].get();
    while (!x.complete()) {
      const bool in_header = x.hdr_done < sizeof(Header);
      char* dst = in_header ? reinterpret_cast<char*>(&x.got) + x.hdr_done : x.data + x.done;
      size_t want = in_header ? sizeof(Header) - x.hdr_done : x.hdr.bytes - x.done;
      ssize_t n = 0;
      if (link) {
        // One whole record, opened and checked, or nothing yet.
        size_t got = 0;
        std::string err;
        const auto p = link->recv_record(fd, dst, want, &got, &err);
        if (p == detail::SealedLink::Progress::kAgain) return;
        if (p == detail::SealedLink::Progress::kError) fail_peer(x, what, err);
        n = static_cast<ssize_t>(got);
      } else {
        n = ::recv(fd, dst, want, MSG_DONTWAIT);
      }
      if (n == 0) fail_peer(x, what, "connection closed");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        fail_peer(x, what, std::strerror(errno));
      }
      if (in_header) {
        x.hdr_done += static_cast<size_t>(n);
        if (x.hdr_done == sizeof(Header) && !(x.got == x.hdr))
          throw CommError(concat(name_, ": rank ", rank_, ": ", what, " from rank ", x.peer,
                                 ": expected ", kind_name(x.hdr.kind), " tag ", x.hdr.tag, " of ",
                                 x.hdr.bytes, " bytes, got ", kind_name(x.got.kind), " tag ",
                                 x.got.tag, " of ", x.got.bytes, " bytes"));
        continue;
      }
      x.done += static_cast<size_t>(n);
      bytes_received_ += static_cast<uint64_t>(n);
      if (x.reduce_into) {
        size_t ready = x.done / sizeof(float);
        reduce_span(x.reduce_into + x.reduced, reinterpret_cast<const float*>(x.data) + x.reduced,
                    ready - x.reduced, x.op);
        x.reduced = ready;
      }
    }
  }

  // Moves every transfer in xs to completion, at most one send and one receive per peer.
  void exchange(std::span<Xfer> xs, Clock::time_point deadline, const char* what) {
    const auto t0 = Clock::now();
    // An injected slow link (fault slow_link): the messages wait before they leave.
    if (const Millis delay = link_delay(); delay.count() > 0)
      for (const Xfer& x : xs)
        if (x.is_send) {
          std::this_thread::sleep_for(delay);
          break;
        }
    // Slot 0 is the abort eventfd; then one slot per distinct socket.
    std::vector<pollfd> pfds{{abort_fd_.get(), POLLIN, 0}};
    std::vector<size_t> slot(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      int fd = peers_[xs[i].peer].get();
      auto it = std::find_if(pfds.begin() + 1, pfds.end(), [&](auto& p) { return p.fd == fd; });
      slot[i] = static_cast<size_t>(it - pfds.begin());
      if (it == pfds.end()) pfds.push_back({fd, 0, 0});
    }
    bool first = true;
    for (;;) {
      if (aborted_.load()) throw_aborted(what);
      bool all_done = true;
      for (size_t i = 0; i < xs.size(); ++i) {
        Xfer& x = xs[i];
        if (x.complete()) continue;
        // Try every transfer once before the first poll: most small sends just go.
        const short ready = pfds[slot[i]].revents;
        if (x.is_send && (first || (ready & (POLLOUT | POLLERR | POLLHUP)))) {
          progress_send(x, what);
          if (x.complete()) account_send(x, t0);
        }
        if (!x.is_send && (first || (ready & (POLLIN | POLLERR | POLLHUP)))) progress_recv(x, what);
        all_done &= x.complete();
      }
      if (all_done) return;
      first = false;
      for (auto& p : pfds) p.events = p.revents = 0;
      pfds[0].events = POLLIN;
      for (size_t i = 0; i < xs.size(); ++i)
        if (!xs[i].complete()) pfds[slot[i]].events |= xs[i].is_send ? POLLOUT : POLLIN;
      if (Clock::now() >= deadline) throw_timeout(xs, what);
      int rc = ::poll(pfds.data(), pfds.size(), detail::poll_ms_left(deadline));
      if (rc < 0 && errno == EINTR) continue;
      KEEL_CHECK_ERRNO(rc);
      if (pfds[0].revents) throw_aborted(what);
    }
  }

  void account_send(const Xfer& x, Clock::time_point t0) {
    Link& l = links_[size_t(x.peer)];
    l.bytes += x.hdr.bytes;
    l.sends += 1;
    l.send_ns += std::chrono::nanoseconds(Clock::now() - t0).count();
  }

  [[noreturn]] void throw_timeout(std::span<Xfer> xs, const char* what) const {
    std::string pending;
    for (const Xfer& x : xs) {
      if (x.complete()) continue;
      pending += concat(pending.empty() ? "" : ", ", x.is_send ? "sending to" : "receiving from",
                        " rank ", x.peer, " (", x.done, " of ", x.hdr.bytes, " bytes)");
    }
    throw CommTimeout(concat(name_, ": rank ", rank_, ": ", what, " timed out ", pending));
  }

  const std::string name_;
  const int rank_, size_;
  const Millis timeout_;
  std::vector<Fd> peers_;                                  // by rank; empty for our own
  std::vector<std::unique_ptr<detail::SealedLink>> seal_;  // by rank; null: not sealed
  Fd abort_fd_;
  std::atomic<bool> aborted_{false};
  std::exception_ptr error_;    // the first CommError; rethrown by every later call
  std::vector<float> scratch_;  // receive buffer of the reduce-scatter steps
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0};
  std::atomic<int64_t> wait_ns_{0};
  struct Link {
    std::atomic<uint64_t> bytes{0}, sends{0};
    std::atomic<int64_t> send_ns{0};
  };
  std::vector<Link> links_;  // by peer rank, for link_stats()
};

}  // namespace

std::unique_ptr<Communicator> make_socket_communicator(std::shared_ptr<Store> store,
                                                       const SocketCommOptions& opts) {
  KEEL_CHECK(opts.size >= 1 && opts.rank >= 0 && opts.rank < opts.size, "socket communicator '",
             opts.name, "': rank ", opts.rank, " of size ", opts.size);
  KEEL_CHECK(!opts.name.empty(), "socket communicator needs a group name");
  KEEL_CHECK(opts.timeout.count() > 0, "socket communicator '", opts.name,
             "': timeout must be > 0");
  std::vector<detail::MeshPeer> peers;
  if (opts.size > 1) {
    KEEL_CHECK(store != nullptr, "socket communicator '", opts.name, "' needs a store");
    peers = detail::connect_mesh(*store, opts);
  }
  return std::make_unique<SocketCommunicator>(std::move(peers), opts);
}

}  // namespace keel
