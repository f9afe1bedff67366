// The backup client (ckpt/backup_service.h); its wire format is ckpt/backup_wire.h.
#include "ckpt/backup_service.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "ckpt/backup_wire.h"
#include "ckpt/checksum.h"
#include "ckpt/snapshot_region.h"
#include "model/train_state.h"
#include "parallel/comm_error.h"
#include "parallel/peer_auth.h"
#include "parallel/sealed_channel.h"
#include "parallel/tcp_store.h"

namespace keel {

using detail::Clock;
using detail::Fd;
using detail::IoResult;
using namespace backup_wire;

namespace {

// Receives a FETCH payload of state.bytes() into the state's spans, feeding `sum` as the
// bytes arrive. Host memory (the CPU backend) is received into directly; device memory
// through one bounded host buffer.
IoResult recv_into_state(SealedChannel& ch, TrainState& state, std::chrono::milliseconds stall,
                         ChecksumStream* sum, std::string* err) {
  Backend* backend = state.backend();
  const bool host = backend->kind() == DeviceKind::kCpu;
  std::unique_ptr<char[]> staging;
  if (!host) staging.reset(new char[std::min(kStaging, state.bytes())]);
  for (const StateSpan& s : state.spans()) {
    char* dst = reinterpret_cast<char*>(s.data);
    if (host) {
      IoResult r = recv_chunked(ch, dst, s.bytes(), stall, sum, err);
      if (r != IoResult::kOk) return r;
      continue;
    }
    for (size_t off = 0; off < s.bytes(); off += kStaging) {
      const size_t n = std::min(kStaging, s.bytes() - off);
      IoResult r = recv_chunked(ch, staging.get(), n, stall, sum, err);
      if (r != IoResult::kOk) return r;
      backend->copy_from_host(dst + off, staging.get(), n);
    }
  }
  return IoResult::kOk;
}

// Reads a reply, its header into `h` and its message into `msg`; returns "" or what failed.
std::string recv_reply(SealedChannel& ch, std::chrono::milliseconds timeout, ReplyHeader* h,
                       std::string* msg) {
  std::string err;
  IoResult r = ch.recv(h, sizeof(*h), Clock::now() + timeout, &err);
  if (r != IoResult::kOk) return io_text(r, err);
  if (h->magic != kReplyMagic || h->msg_len > kMaxMessage) return "garbled reply";
  msg->assign(h->msg_len, '\0');
  r = ch.recv(msg->data(), msg->size(), Clock::now() + timeout, &err);
  return r == IoResult::kOk ? "" : io_text(r, err);
}

// Sends request `rq` and reads its reply; returns "" or what failed.
std::string ask(SealedChannel& ch, const RequestHeader& rq, std::chrono::milliseconds timeout,
                ReplyHeader* h, std::string* msg) {
  std::string err;
  IoResult r = ch.send(&rq, sizeof(rq), Clock::now() + timeout, &err);
  if (r != IoResult::kOk) return io_text(r, err);
  return recv_reply(ch, timeout, h, msg);
}

}  // namespace

BackupClient::BackupClient(std::string addr, std::chrono::milliseconds timeout,
                           std::chrono::milliseconds connect_timeout)
    : addr_(std::move(addr)),
      timeout_(timeout),
      connect_timeout_(connect_timeout.count() > 0 ? connect_timeout : timeout) {}

BackupClient::~BackupClient() = default;

void BackupClient::fail(const std::string& what) {
  fd_.reset();  // never reuse a connection in an unknown state
  ch_ = SealedChannel();
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
    const SessionKeys keys = authenticate_to_server(
        fd_.get(), {"backup", 0}, Clock::now() + connect_timeout_, "backup holder " + addr_);
    ch_ = SealedChannel(fd_.get(), keys, /*client=*/true);
  } catch (const CommError& e) {
    fd_.reset();
    throw BackupError(e.what());
  }
}

void BackupClient::push_raw(int owner_rank, int64_t step, uint64_t fingerprint, const void* payload,
                            size_t bytes, uint64_t sum, bool verified) {
  connect();
  RequestHeader rq{
      kRequestMagic, kPush, owner_rank, verified ? kPushVerified : 0u, step, fingerprint,
      bytes,         sum,   0};
  std::string err;
  IoResult r = ch_.send(&rq, sizeof(rq), Clock::now() + timeout_, &err);
  if (r == IoResult::kOk) r = send_chunked(ch_, payload, bytes, timeout_, &err);
  const std::string what = "push of step " + std::to_string(step) + ": ";
  if (r != IoResult::kOk) fail(what + io_text(r, err));
  ReplyHeader h{};
  std::string msg;
  if (std::string e = recv_reply(ch_, timeout_, &h, &msg); !e.empty()) fail(what + e);
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
  RequestHeader rq{kRequestMagic, kFetch, owner_rank, 0, step, 0, 0, 0, 0};
  const std::string what = "fetch of step " + std::to_string(step) + ": ";
  ReplyHeader h{};
  std::string msg;
  if (std::string e = ask(ch_, rq, timeout_, &h, &msg); !e.empty()) fail(what + e);
  if (h.status != kOk) {
    *why = msg;
    return false;
  }
  if (h.fingerprint != state.layout_fingerprint() || h.bytes != state.bytes()) {
    // The payload that follows is useless; dropping the connection is cheaper than reading it.
    fd_.reset();
    ch_ = SealedChannel();
    *why = detail::concat("backup of rank ", owner_rank, " step ", step, " at ", addr_,
                          " has layout ", std::hex, h.fingerprint, std::dec, " (", h.bytes,
                          " bytes), the state has ", std::hex, state.layout_fingerprint(), std::dec,
                          " (", state.bytes(), " bytes)");
    return false;
  }
  // Straight into the state, checksummed as it arrives.
  ChecksumStream sum;
  std::string err;
  IoResult r = recv_into_state(ch_, state, timeout_, &sum, &err);
  if (r != IoResult::kOk) fail(what + io_text(r, err));
  if (sum.digest() != h.checksum) {
    // The holder's slot or the wire: the holder checks its slot (and drops it if damaged).
    rq.op = kVerify;
    if (std::string e = ask(ch_, rq, timeout_, &h, &msg); !e.empty()) fail(what + e);
    *why = h.status == kRefused
               ? msg
               : detail::concat("backup of rank ", owner_rank, " step ", step, " from ", addr_,
                                ": checksum mismatch in transfer");
    return false;
  }
  if (checksum) *checksum = h.checksum;
  return true;
}

bool BackupClient::fetch_range(int owner_rank, int64_t step, uint64_t fingerprint, size_t offset,
                               size_t bytes, void* out, std::string* why) {
  connect();
  RequestHeader rq{kRequestMagic, kFetchRange, owner_rank, 0, step, fingerprint, bytes, 0, offset};
  const std::string what = detail::concat("fetch of bytes ", offset, "+", bytes, " of rank ",
                                          owner_rank, " step ", step, ": ");
  ReplyHeader h{};
  std::string msg;
  if (std::string e = ask(ch_, rq, timeout_, &h, &msg); !e.empty()) fail(what + e);
  if (h.status != kOk) {
    *why = msg;
    return false;
  }
  if (h.bytes != bytes) fail(what + "garbled reply");
  ChecksumStream sum;
  std::string err;
  const IoResult r = recv_chunked(ch_, out, bytes, timeout_, &sum, &err);
  if (r != IoResult::kOk) fail(what + io_text(r, err));
  if (sum.digest() != h.checksum) {
    *why = detail::concat("backup holder ", addr_, ": ", what, "checksum mismatch in transfer");
    return false;
  }
  return true;
}

}  // namespace keel
