// Backup server and client over TCP; see backup_service.h.
//
// Wire format (both ends are keel builds on the same architecture, so structs go as they
// are in memory): a request is a RequestHeader, followed for PUSH by `bytes` of payload; a
// reply is a ReplyHeader and `msg_len` bytes of message, followed for a successful FETCH by
// `bytes` of payload. VERIFY (sent by a client whose fetched payload did not match) checks
// the held slot: kOk, or kRefused once the damaged slot is dropped. Requests on one
// connection are answered in order.
#include "ckpt/backup_service.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/checksum.h"
#include "ckpt/snapshot_region.h"
#include "model/train_state.h"
#include "parallel/comm_error.h"
#include "parallel/peer_auth.h"
#include "parallel/tcp_store.h"
#include "runtime/logging.h"

namespace keel {

using detail::Clock;
using detail::Fd;
using detail::IoResult;

namespace {

constexpr uint32_t kRequestMagic = 0x4b42524bu;  // "KRBK"
constexpr uint32_t kReplyMagic = 0x4b425250u;    // "PRBK"
enum Op : uint32_t { kPush = 1, kFetch = 2, kVerify = 3 };
enum Status : int32_t { kOk = 0, kNotHeld = 1, kRefused = 2 };
// Transfers go in pieces, each with its own deadline: the timeout bounds a stall, not the
// time a large snapshot legitimately takes. A received piece is checksummed right after it
// lands, while it is still in the (last-level) cache.
constexpr size_t kChunk = size_t{4} << 20;
// A GPU state is received through a host buffer of this size, not one as large as the state.
constexpr size_t kStaging = size_t{16} << 20;
// No state of one rank comes near this; a larger claim is a garbled header.
constexpr uint64_t kMaxPayload = uint64_t{1} << 40;
constexpr uint32_t kMaxMessage = 1 << 16;

// RequestHeader::flags of a push: the payload is the owner's verified snapshot (SDC checks),
// kept in the holder's verified slot beside the two newest backups.
constexpr uint32_t kPushVerified = 1;

struct RequestHeader {
  uint32_t magic;
  uint32_t op;
  int32_t owner;
  uint32_t flags;
  int64_t step;
  uint64_t fingerprint;
  uint64_t bytes;
  uint64_t checksum;
};

struct ReplyHeader {
  uint32_t magic;
  int32_t status;
  uint32_t msg_len;
  uint32_t reserved;
  int64_t step;
  uint64_t fingerprint;
  uint64_t bytes;
  uint64_t checksum;
};

// Sends or receives `len` bytes in chunks, each chunk within `stall` of the previous one.
// With `sum`, received bytes are fed to it as they arrive.
IoResult send_chunked(int fd, const void* buf, size_t len, std::chrono::milliseconds stall,
                      std::string* err) {
  const char* p = static_cast<const char*>(buf);
  for (size_t off = 0; off < len; off += kChunk) {
    size_t n = std::min(kChunk, len - off);
    IoResult r = detail::send_all(fd, p + off, n, Clock::now() + stall, err);
    if (r != IoResult::kOk) return r;
  }
  return IoResult::kOk;
}

IoResult recv_chunked(int fd, void* buf, size_t len, std::chrono::milliseconds stall,
                      ChecksumStream* sum, std::string* err) {
  char* p = static_cast<char*>(buf);
  for (size_t off = 0; off < len; off += kChunk) {
    size_t n = std::min(kChunk, len - off);
    IoResult r = detail::recv_all(fd, p + off, n, Clock::now() + stall, err);
    if (r != IoResult::kOk) return r;
    if (sum) sum->update(p + off, n);
  }
  return IoResult::kOk;
}

// Receives a FETCH payload of state.bytes() into the state's spans, feeding `sum` as the
// bytes arrive. Host memory (the CPU backend) is received into directly; device memory
// through one bounded host buffer.
IoResult recv_into_state(int fd, TrainState& state, std::chrono::milliseconds stall,
                         ChecksumStream* sum, std::string* err) {
  Backend* backend = state.backend();
  const bool host = backend->kind() == DeviceKind::kCpu;
  std::unique_ptr<char[]> staging;
  if (!host) staging.reset(new char[std::min(kStaging, state.bytes())]);
  for (const StateSpan& s : state.spans()) {
    char* dst = reinterpret_cast<char*>(s.data);
    if (host) {
      IoResult r = recv_chunked(fd, dst, s.bytes(), stall, sum, err);
      if (r != IoResult::kOk) return r;
      continue;
    }
    for (size_t off = 0; off < s.bytes(); off += kStaging) {
      const size_t n = std::min(kStaging, s.bytes() - off);
      IoResult r = recv_chunked(fd, staging.get(), n, stall, sum, err);
      if (r != IoResult::kOk) return r;
      backend->copy_from_host(dst + off, staging.get(), n);
    }
  }
  return IoResult::kOk;
}

std::string io_text(IoResult r, const std::string& err) {
  if (r == IoResult::kTimeout) return "timed out";
  return err.empty() ? "connection closed" : err;
}

// Reads a reply, its header into `h` and its message into `msg`; returns "" or what failed.
std::string recv_reply(int fd, std::chrono::milliseconds timeout, ReplyHeader* h,
                       std::string* msg) {
  std::string err;
  IoResult r = detail::recv_all(fd, h, sizeof(*h), Clock::now() + timeout, &err);
  if (r != IoResult::kOk) return io_text(r, err);
  if (h->magic != kReplyMagic || h->msg_len > kMaxMessage) return "garbled reply";
  msg->assign(h->msg_len, '\0');
  r = detail::recv_all(fd, msg->data(), msg->size(), Clock::now() + timeout, &err);
  return r == IoResult::kOk ? "" : io_text(r, err);
}

std::string steps_text(const std::vector<int64_t>& steps) {
  std::string s;
  for (int64_t x : steps) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s.empty() ? "none" : s;
}

}  // namespace

// ---------------------------------------------------------------- server

struct BackupServer::Impl {
  std::string job;
  int holder;
  BackupServerOptions opt;
  std::string segment;
  Fd listener;
  Fd wake_read, wake_write;  // a byte here ends serve()
  // A connection serves requests once it has proven the job's key.
  struct Conn {
    Fd fd;
    ServerHandshake auth{AuthChannel{"backup", 0}};
    Clock::time_point accepted_at = Clock::now();
    bool authenticated() const { return auth.state() == ServerHandshake::State::kDone; }
  };
  std::vector<Conn> conns;
  std::unique_ptr<SnapshotRegion> region;
  std::unique_ptr<SnapshotRegion> own;  // the holder's own snapshots (serve_own_snapshot)
  std::thread thread;
  std::once_flag stopped;
  int port = 0;
  std::atomic<int64_t> committed{0}, refused{0};

  void serve();
  void accept_all();
  // Serves one request from a readable connection; false: drop the connection.
  bool handle(int fd);
  bool handle_push(int fd, const RequestHeader& rq);
  bool handle_fetch(int fd, const RequestHeader& rq);
  bool handle_verify(int fd, const RequestHeader& rq);
  // The slot a FETCH or VERIFY of `rq` is served from (the backup segment, else with
  // serve_own_snapshot the holder's own), and which region holds it.
  std::optional<SlotView> find_served(const RequestHeader& rq, SnapshotRegion** from);
  bool reply(int fd, Status status, const std::string& msg, const ReplyHeader* fields = nullptr);
};

BackupServer::BackupServer(const std::string& job, int holder_rank, BackupServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.job = job;
  m.holder = holder_rank;
  m.opt = std::move(options);
  m.segment = backup_segment_name(job, holder_rank);
  // Backups written by an earlier worker of this rank are served as they are.
  try {
    m.region = SnapshotRegion::open_existing(m.segment, /*writable=*/true);
  } catch (const SnapshotError& e) {
    // Not worth failing the worker over: the next push makes a fresh segment.
    LOG(WARNING) << "backup server: " << e.what() << "; starting without backups";
    if (::shm_unlink(m.segment.c_str()) != 0)
      KEEL_CHECK(errno == ENOENT, "shm_unlink ", m.segment, ": ", std::strerror(errno));
  }
  m.listener = detail::listen_tcp(m.opt.host, m.opt.port, 64);
  m.port = detail::local_port(m.listener.get());
  int p[2];
  KEEL_CHECK_ERRNO(::pipe2(p, O_CLOEXEC | O_NONBLOCK));
  m.wake_read = Fd(p[0]);
  m.wake_write = Fd(p[1]);
  m.thread = std::thread([this] { impl_->serve(); });
}

BackupServer::~BackupServer() {
  stop();
}

int BackupServer::port() const {
  return impl_->port;
}
std::string BackupServer::address() const {
  return detail::join_host_port(impl_->opt.host, impl_->port);
}
int64_t BackupServer::pushes_committed() const {
  return impl_->committed.load();
}
int64_t BackupServer::pushes_refused() const {
  return impl_->refused.load();
}

void BackupServer::stop() {
  std::call_once(impl_->stopped, [this] {
    char one = 1;
    KEEL_CHECK(::write(impl_->wake_write.get(), &one, 1) == 1,
               "backup server wake: ", std::strerror(errno));
    impl_->thread.join();
    impl_->conns.clear();
    impl_->listener.reset();
  });
}

void BackupServer::Impl::serve() {
  std::vector<pollfd> pfds;
  for (;;) {
    pfds.clear();
    pfds.push_back({wake_read.get(), POLLIN, 0});
    pfds.push_back({listener.get(), POLLIN, 0});
    Clock::time_point next = Clock::time_point::max();
    for (auto& c : conns) {
      pfds.push_back({c.fd.get(), POLLIN, 0});
      if (!c.authenticated()) next = std::min(next, c.accepted_at + kHandshakeTimeout);
    }
    int rc = ::poll(pfds.data(), pfds.size(),
                    next == Clock::time_point::max() ? -1 : detail::poll_ms_left(next));
    if (rc < 0 && errno == EINTR) continue;
    // The server thread has no caller to throw to; a failing poll() means a broken process.
    KEEL_CHECK(rc >= 0, "backup server: poll: ", std::strerror(errno));
    if (pfds[0].revents) return;
    std::vector<bool> drop(conns.size(), false);
    const auto now = Clock::now();
    for (size_t i = 2; i < pfds.size(); ++i) {
      Conn& c = conns[i - 2];
      if (!c.authenticated()) {
        // Not one byte of a request before the key is proven; and not for long.
        ServerHandshake::State a = ServerHandshake::State::kPending;
        if (pfds[i].revents) a = c.auth.pump(c.fd.get());
        drop[i - 2] =
            a == ServerHandshake::State::kRefused ||
            (a == ServerHandshake::State::kPending && now - c.accepted_at >= kHandshakeTimeout);
        continue;
      }
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      try {
        drop[i - 2] = !handle(pfds[i].fd);
      } catch (const std::exception& e) {
        // A request we could not serve (e.g. no memory for a segment) costs its connection,
        // not the server.
        LOG(WARNING) << "backup server " << segment << ": dropping a connection: " << e.what();
        drop[i - 2] = true;
      }
    }
    for (size_t i = conns.size(); i-- > 0;)
      if (drop[i]) conns.erase(conns.begin() + static_cast<ptrdiff_t>(i));
    if (pfds[1].revents) accept_all();
  }
}

void BackupServer::Impl::accept_all() {
  for (;;) {
    int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a connection that died before we took it
    detail::set_nodelay(fd);
    conns.push_back(Conn{Fd(fd)});
    // A flood of connections that never authenticate must not crowd out the job's own.
    auto pending = [](const Conn& c) { return !c.authenticated(); };
    if (std::count_if(conns.begin(), conns.end(), pending) > kMaxPendingHandshakes)
      conns.erase(std::find_if(conns.begin(), conns.end(), pending));
  }
}

bool BackupServer::Impl::handle(int fd) {
  RequestHeader rq{};
  std::string err;
  if (detail::recv_all(fd, &rq, sizeof(rq), Clock::now() + opt.io_timeout, &err) != IoResult::kOk)
    return false;  // closed by the client, or stalled mid-header
  if (rq.magic != kRequestMagic) return false;
  if (rq.op == kPush) return handle_push(fd, rq);
  if (rq.op == kFetch) return handle_fetch(fd, rq);
  if (rq.op == kVerify) return handle_verify(fd, rq);
  return false;
}

bool BackupServer::Impl::handle_push(int fd, const RequestHeader& rq) {
  if (rq.bytes > kMaxPayload || rq.step < 0) return false;
  const bool verified = rq.flags & kPushVerified;
  ChecksumStream sum;
  std::string err;
  if (!region) {
    // The first push: nothing held to protect, so it goes straight into a new segment.
    if (::shm_unlink(segment.c_str()) != 0)
      KEEL_CHECK(errno == ENOENT, "shm_unlink ", segment, ": ", std::strerror(errno));
    region = SnapshotRegion::open_or_create(segment, rq.bytes, rq.fingerprint, rq.owner);
  }
  const bool same_layout =
      region->capacity() == rq.bytes && region->fingerprint() == rq.fingerprint;
  int slot = -1;
  std::unique_ptr<char[]> staging;
  if (same_layout) {
    // Received straight into the slot: a connection lost midway leaves it invalid, and the
    // other slot (the newest backup) untouched.
    // Backups of steps >= this one predate a restore of the owner to an older step (a
    // verified snapshot is older than the newest backups by design: it replaces only itself).
    if (verified) {
      slot = SnapshotRegion::kVerifiedSlot;
    } else {
      region->invalidate_from(rq.step, rq.owner);
      slot = region->free_slot();
    }
    region->begin_write(slot);
    if (recv_chunked(fd, region->payload(slot), rq.bytes, opt.io_timeout, &sum, &err) !=
        IoResult::kOk)
      return false;
  } else {
    // A new layout (the owner's model or parallel layout changed after a rebuild) replaces
    // the segment, which drops the backups held so far. Staged on the heap first (not
    // zero-filled: every byte is received) so that a push which dies midway or arrives
    // damaged destroys nothing.
    staging.reset(new char[rq.bytes]);
    if (recv_chunked(fd, staging.get(), rq.bytes, opt.io_timeout, &sum, &err) != IoResult::kOk)
      return false;
  }
  const uint64_t got = sum.digest();
  if (got != rq.checksum) {
    ++refused;
    return reply(fd, kRefused,
                 detail::concat("backup of rank ", rq.owner, " step ", rq.step,
                                " refused: checksum mismatch (sent ", std::hex, rq.checksum,
                                ", received ", got, ")"));
  }
  if (staging) {
    LOG(INFO) << "backup server " << segment << ": new layout, dropping the old backups";
    region.reset();
    if (::shm_unlink(segment.c_str()) != 0)
      KEEL_CHECK(errno == ENOENT, "shm_unlink ", segment, ": ", std::strerror(errno));
    region = SnapshotRegion::open_or_create(segment, rq.bytes, rq.fingerprint, rq.owner);
    slot = verified ? SnapshotRegion::kVerifiedSlot : region->free_slot();
    region->begin_write(slot);
    std::memcpy(region->payload(slot), staging.get(), rq.bytes);
  }
  region->commit(slot, rq.step, rq.bytes, got, rq.fingerprint, rq.owner, verified);
  ++committed;
  return reply(fd, kOk, "");
}

std::optional<SlotView> BackupServer::Impl::find_served(const RequestHeader& rq,
                                                        SnapshotRegion** from) {
  std::optional<SlotView> v;
  if (region) v = region->find(rq.step, rq.owner);
  *from = region.get();
  // A holder's own state is always served: a replay worker on another machine asks the
  // rank itself when the rank's holder lacks the step.
  if (!v && (opt.serve_own_snapshot || rq.owner == holder)) {
    // Opened at first use: the worker creates its own segment after this server.
    if (!own) own = SnapshotRegion::open_existing(snapshot_segment_name(job, holder));
    if (own) v = own->find(rq.step);
    if (v) *from = own.get();
  }
  return v;
}

bool BackupServer::Impl::handle_fetch(int fd, const RequestHeader& rq) {
  SnapshotRegion* from = nullptr;
  std::optional<SlotView> v = find_served(rq, &from);
  if (!v)
    return reply(
        fd, kNotHeld,
        detail::concat("rank ", holder, " holds no backup of rank ", rq.owner, " at step ", rq.step,
                       " (holds steps: ",
                       steps_text(region ? region->valid_steps(rq.owner) : std::vector<int64_t>{}),
                       ")"));
  ReplyHeader f{};
  f.step = v->step;
  f.fingerprint = v->fingerprint;
  f.bytes = v->bytes;
  f.checksum = v->checksum;
  if (!reply(fd, kOk, "", &f)) return false;
  // Sent as it is, with no pass of its own first: the client checksums what it receives,
  // which covers this slot as well as the wire, and asks for VERIFY only on a mismatch.
  std::string err;
  return send_chunked(fd, v->payload, v->bytes, opt.io_timeout, &err) == IoResult::kOk;
}

bool BackupServer::Impl::handle_verify(int fd, const RequestHeader& rq) {
  SnapshotRegion* from = nullptr;
  std::optional<SlotView> v = find_served(rq, &from);
  if (!v) return reply(fd, kNotHeld, "");
  std::string why;
  if (SnapshotRegion::verify(*v, &why)) return reply(fd, kOk, "");
  if (from == region.get()) {
    // Only this server writes the backup segment, so the slot is damaged where it lies:
    // dropped, so that a survey no longer offers its step.
    region->begin_write(v->slot);
    why += "; dropped";
  }
  return reply(fd, kRefused,
               detail::concat(from == region.get() ? "backup" : "own snapshot", " held by rank ",
                              holder, ": ", why));
}

bool BackupServer::Impl::reply(int fd, Status status, const std::string& msg,
                               const ReplyHeader* fields) {
  ReplyHeader h = fields ? *fields : ReplyHeader{};
  h.magic = kReplyMagic;
  h.status = status;
  h.msg_len = static_cast<uint32_t>(std::min<size_t>(msg.size(), kMaxMessage));
  std::string err;
  auto deadline = Clock::now() + opt.io_timeout;
  return detail::send_all(fd, &h, sizeof(h), deadline, &err) == IoResult::kOk &&
         detail::send_all(fd, msg.data(), h.msg_len, deadline, &err) == IoResult::kOk;
}

// ---------------------------------------------------------------- client

BackupClient::BackupClient(std::string addr, std::chrono::milliseconds timeout,
                           std::chrono::milliseconds connect_timeout)
    : addr_(std::move(addr)),
      timeout_(timeout),
      connect_timeout_(connect_timeout.count() > 0 ? connect_timeout : timeout) {}

BackupClient::~BackupClient() = default;

void BackupClient::fail(const std::string& what) {
  fd_.reset();  // never reuse a connection in an unknown state
  throw BackupError(detail::concat("backup holder ", addr_, ": ", what));
}

void BackupClient::connect() {
  if (fd_.valid()) return;
  auto [host, port] = parse_host_port(addr_);
  try {
    fd_ =
        detail::connect_tcp(host, port, Clock::now() + connect_timeout_, "backup holder " + addr_);
  } catch (const CommError& e) {
    throw BackupError(e.what());  // names the holder already
  }
  detail::set_nodelay(fd_.get());
  try {
    authenticate_to_server(fd_.get(), {"backup", 0}, Clock::now() + connect_timeout_,
                           "backup holder " + addr_);
  } catch (const CommError& e) {
    fd_.reset();
    throw BackupError(e.what());
  }
}

void BackupClient::push_raw(int owner_rank, int64_t step, uint64_t fingerprint, const void* payload,
                            size_t bytes, uint64_t sum, bool verified) {
  connect();
  RequestHeader rq{kRequestMagic, kPush,       owner_rank, verified ? kPushVerified : 0u,
                   step,          fingerprint, bytes,      sum};
  std::string err;
  IoResult r = detail::send_all(fd_.get(), &rq, sizeof(rq), Clock::now() + timeout_, &err);
  if (r == IoResult::kOk) r = send_chunked(fd_.get(), payload, bytes, timeout_, &err);
  const std::string what = "push of step " + std::to_string(step) + ": ";
  if (r != IoResult::kOk) fail(what + io_text(r, err));
  ReplyHeader h{};
  std::string msg;
  if (std::string e = recv_reply(fd_.get(), timeout_, &h, &msg); !e.empty()) fail(what + e);
  // A refusal leaves the connection in step (the server read the whole payload).
  if (h.status != kOk) throw BackupError(detail::concat("backup holder ", addr_, ": ", msg));
}

size_t BackupClient::push(const SnapshotRegion& region, int64_t step, bool verified) {
  auto v = verified ? region.slot_view(SnapshotRegion::kVerifiedSlot) : region.find(step);
  if (!v || v->step != step)
    throw BackupError(detail::concat("cannot push step ", step, ": no committed ",
                                     verified ? "verified " : "", "slot of ", region.name(),
                                     " holds it"));
  push_raw(v->owner_rank, v->step, v->fingerprint, v->payload, v->bytes, v->checksum, verified);
  return v->bytes;
}

bool BackupClient::fetch(int owner_rank, int64_t step, TrainState& state, std::string* why,
                         uint64_t* checksum) {
  std::string local;
  if (!why) why = &local;
  connect();
  RequestHeader rq{kRequestMagic, kFetch, owner_rank, 0, step, 0, 0, 0};
  std::string err;
  const std::string what = "fetch of step " + std::to_string(step) + ": ";
  IoResult r = detail::send_all(fd_.get(), &rq, sizeof(rq), Clock::now() + timeout_, &err);
  if (r != IoResult::kOk) fail(what + io_text(r, err));
  ReplyHeader h{};
  std::string msg;
  if (std::string e = recv_reply(fd_.get(), timeout_, &h, &msg); !e.empty()) fail(what + e);
  if (h.status != kOk) {
    *why = msg;
    return false;
  }
  if (h.fingerprint != state.layout_fingerprint() || h.bytes != state.bytes()) {
    // The payload that follows is useless; dropping the connection is cheaper than reading it.
    fd_.reset();
    *why = detail::concat("backup of rank ", owner_rank, " step ", step, " at ", addr_,
                          " has layout ", std::hex, h.fingerprint, std::dec, " (", h.bytes,
                          " bytes), the state has ", std::hex, state.layout_fingerprint(), std::dec,
                          " (", state.bytes(), " bytes)");
    return false;
  }
  // Straight into the state, checksummed as it arrives.
  ChecksumStream sum;
  r = recv_into_state(fd_.get(), state, timeout_, &sum, &err);
  if (r != IoResult::kOk) fail(what + io_text(r, err));
  if (sum.digest() != h.checksum) {
    // The holder's slot or the wire: the holder checks its slot (and drops it if damaged).
    rq.op = kVerify;
    r = detail::send_all(fd_.get(), &rq, sizeof(rq), Clock::now() + timeout_, &err);
    if (r != IoResult::kOk) fail(what + io_text(r, err));
    if (std::string e = recv_reply(fd_.get(), timeout_, &h, &msg); !e.empty()) fail(what + e);
    *why = h.status == kRefused
               ? msg
               : detail::concat("backup of rank ", owner_rank, " step ", step, " from ", addr_,
                                ": checksum mismatch in transfer");
    return false;
  }
  if (checksum) *checksum = h.checksum;
  return true;
}

}  // namespace keel
