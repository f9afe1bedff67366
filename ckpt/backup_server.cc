// The backup server (ckpt/backup_service.h); its wire format is ckpt/backup_wire.h.
#include "ckpt/backup_service.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/backup_wire.h"
#include "ckpt/checksum.h"
#include "ckpt/snapshot_region.h"
#include "parallel/peer_auth.h"
#include "parallel/sealed_channel.h"
#include "parallel/socket_util.h"
#include "runtime/logging.h"

namespace keel {

using detail::Clock;
using detail::Fd;
using detail::IoResult;
using namespace backup_wire;

namespace {

std::string steps_text(const std::vector<int64_t>& steps) {
  std::string s;
  for (int64_t x : steps) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s.empty() ? "none" : s;
}

}  // namespace

struct BackupServer::Impl {
  std::string job;
  int holder;
  BackupServerOptions opt;
  std::string segment;
  Fd listener;
  Fd wake_read, wake_write;  // a byte here ends serve()
  // A connection serves requests once it has proven the job's key, over its channel
  // (sealed when it crosses machines).
  struct Conn {
    Fd fd;
    ServerHandshake auth{AuthChannel{"backup", 0}};
    Clock::time_point accepted_at = Clock::now();
    SealedChannel ch;
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
  bool handle(SealedChannel& ch);
  bool handle_push(SealedChannel& ch, const RequestHeader& rq);
  bool handle_fetch(SealedChannel& ch, const RequestHeader& rq);
  bool handle_verify(SealedChannel& ch, const RequestHeader& rq);
  bool handle_fetch_range(SealedChannel& ch, const RequestHeader& rq);
  // Whether slot `v` passes its checksum, checked once per slot content: a range the client
  // reads is covered by a checksum of its own, the slot's memory by this.
  bool slot_verified(const SlotView& v, std::string* why);
  struct Verified {
    const char* payload;
    int64_t step;
    uint64_t checksum;
  };
  std::vector<Verified> verified;  // the newest few slots that passed
  // The slot a FETCH or VERIFY of `rq` is served from (the backup segment, else with
  // serve_own_snapshot the holder's own), and which region holds it.
  std::optional<SlotView> find_served(const RequestHeader& rq, SnapshotRegion** from);
  bool reply(SealedChannel& ch, Status status, const std::string& msg,
             const ReplyHeader* fields = nullptr);
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
        if (a == ServerHandshake::State::kDone)
          c.ch = SealedChannel(c.fd.get(), c.auth.keys(), /*client=*/false);
        drop[i - 2] =
            a == ServerHandshake::State::kRefused ||
            (a == ServerHandshake::State::kPending && now - c.accepted_at >= kHandshakeTimeout);
        continue;
      }
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      try {
        drop[i - 2] = !handle(c.ch);
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
    conns.push_back(Conn{Fd(fd), {AuthChannel{"backup", 0}}, Clock::now(), {}});
    // A flood of connections that never authenticate must not crowd out the job's own.
    auto pending = [](const Conn& c) { return !c.authenticated(); };
    if (std::count_if(conns.begin(), conns.end(), pending) > kMaxPendingHandshakes)
      conns.erase(std::find_if(conns.begin(), conns.end(), pending));
  }
}

bool BackupServer::Impl::handle(SealedChannel& ch) {
  RequestHeader rq{};
  std::string err;
  if (ch.recv(&rq, sizeof(rq), Clock::now() + opt.io_timeout, &err) != IoResult::kOk)
    return false;  // closed by the client, stalled mid-header, or a record that failed its check
  if (rq.magic != kRequestMagic) return false;
  if (rq.op == kPush) return handle_push(ch, rq);
  if (rq.op == kFetch) return handle_fetch(ch, rq);
  if (rq.op == kVerify) return handle_verify(ch, rq);
  if (rq.op == kFetchRange) return handle_fetch_range(ch, rq);
  return false;
}

bool BackupServer::Impl::handle_push(SealedChannel& ch, const RequestHeader& rq) {
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
    if (recv_chunked(ch, region->payload(slot), rq.bytes, opt.io_timeout, &sum, &err) !=
        IoResult::kOk)
      return false;
  } else {
    // A new layout (the owner's model or parallel layout changed after a rebuild) replaces
    // the segment, which drops the backups held so far. Staged on the heap first (not
    // zero-filled: every byte is received) so that a push which dies midway or arrives
    // damaged destroys nothing.
    staging.reset(new char[rq.bytes]);
    if (recv_chunked(ch, staging.get(), rq.bytes, opt.io_timeout, &sum, &err) != IoResult::kOk)
      return false;
  }
  const uint64_t got = sum.digest();
  if (got != rq.checksum) {
    ++refused;
    return reply(ch, kRefused,
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
  return reply(ch, kOk, "");
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

bool BackupServer::Impl::handle_fetch(SealedChannel& ch, const RequestHeader& rq) {
  SnapshotRegion* from = nullptr;
  std::optional<SlotView> v = find_served(rq, &from);
  if (!v)
    return reply(
        ch, kNotHeld,
        detail::concat("rank ", holder, " holds no backup of rank ", rq.owner, " at step ", rq.step,
                       " (holds steps: ",
                       steps_text(region ? region->valid_steps(rq.owner) : std::vector<int64_t>{}),
                       ")"));
  ReplyHeader f{};
  f.step = v->step;
  f.fingerprint = v->fingerprint;
  f.bytes = v->bytes;
  f.checksum = v->checksum;
  if (!reply(ch, kOk, "", &f)) return false;
  // Sent as it is, with no pass of its own first: the client checksums what it receives,
  // which covers this slot as well as the wire, and asks for VERIFY only on a mismatch.
  std::string err;
  return send_chunked(ch, v->payload, v->bytes, opt.io_timeout, &err) == IoResult::kOk;
}

bool BackupServer::Impl::slot_verified(const SlotView& v, std::string* why) {
  for (const Verified& x : verified)
    if (x.payload == v.payload && x.step == v.step && x.checksum == v.checksum) return true;
  if (!SnapshotRegion::verify(v, why)) return false;
  if (verified.size() >= 8) verified.erase(verified.begin());
  verified.push_back({v.payload, v.step, v.checksum});
  return true;
}

bool BackupServer::Impl::handle_fetch_range(SealedChannel& ch, const RequestHeader& rq) {
  SnapshotRegion* from = nullptr;
  std::optional<SlotView> v = find_served(rq, &from);
  const std::string what = detail::concat("rank ", holder, ": rank ", rq.owner, " step ", rq.step);
  if (!v) return reply(ch, kNotHeld, what + ": not held");
  if (v->fingerprint != rq.fingerprint)
    return reply(ch, kRefused,
                 detail::concat(what, ": layout ", std::hex, v->fingerprint, ", asked for ",
                                rq.fingerprint));
  if (rq.offset > v->bytes || rq.bytes > v->bytes - rq.offset)
    return reply(
        ch, kRefused,
        detail::concat(what, ": bytes ", rq.offset, "+", rq.bytes, " beyond its ", v->bytes));
  std::string why;
  if (!slot_verified(*v, &why)) {
    if (from == region.get()) region->begin_write(v->slot);  // damaged where it lies: dropped
    return reply(ch, kRefused, what + ": " + why);
  }
  ReplyHeader f{};
  f.step = v->step;
  f.fingerprint = v->fingerprint;
  f.bytes = rq.bytes;
  f.checksum = checksum(v->payload + rq.offset, rq.bytes);
  if (!reply(ch, kOk, "", &f)) return false;
  std::string err;
  return send_chunked(ch, v->payload + rq.offset, rq.bytes, opt.io_timeout, &err) == IoResult::kOk;
}

bool BackupServer::Impl::handle_verify(SealedChannel& ch, const RequestHeader& rq) {
  SnapshotRegion* from = nullptr;
  std::optional<SlotView> v = find_served(rq, &from);
  if (!v) return reply(ch, kNotHeld, "");
  std::string why;
  if (SnapshotRegion::verify(*v, &why)) return reply(ch, kOk, "");
  if (from == region.get()) {
    // Only this server writes the backup segment, so the slot is damaged where it lies:
    // dropped, so that a survey no longer offers its step.
    region->begin_write(v->slot);
    why += "; dropped";
  }
  return reply(ch, kRefused,
               detail::concat(from == region.get() ? "backup" : "own snapshot", " held by rank ",
                              holder, ": ", why));
}

bool BackupServer::Impl::reply(SealedChannel& ch, Status status, const std::string& msg,
                               const ReplyHeader* fields) {
  ReplyHeader h = fields ? *fields : ReplyHeader{};
  h.magic = kReplyMagic;
  h.status = status;
  h.msg_len = static_cast<uint32_t>(std::min<size_t>(msg.size(), kMaxMessage));
  std::string err;
  auto deadline = Clock::now() + opt.io_timeout;
  return ch.send(&h, sizeof(h), deadline, &err) == IoResult::kOk &&
         (h.msg_len == 0 || ch.send(msg.data(), h.msg_len, deadline, &err) == IoResult::kOk);
}

}  // namespace keel
