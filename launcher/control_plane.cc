// ControlServer and ControlClient over cppzmq. Socket options are chosen so that a dead or
// partitioned peer can never stall the controller or an agent: sends never wait (DONTWAIT,
// ROUTER_MANDATORY off), closing never waits (LINGER 0), and ZMTP heartbeats tear down a
// connection whose peer went silent so that a healed partition reconnects within
// RECONNECT_IVL instead of waiting out TCP retransmission backoff.
#include "launcher/control_plane.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <thread>
#include <utility>
#include <vector>

#include <sodium.h>

#include <zmq_addon.hpp>

#include "launcher/timings.h"
#include "parallel/job_key.h"
#include "parallel/tcp_store.h"
#include "runtime/check.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// Reconnect quickly and at a steady rate (no backoff): a slot whose link comes back should
// be heard from well within the controller's slot timeout (2 s by default).
constexpr int kReconnectIvlMs = int(timings::kReconnectEvery.count());
// ZMTP heartbeats: a connection whose peer sent nothing for kHeartbeatTimeoutMs is closed
// (and, on a client, reconnected).
constexpr int kHeartbeatIvlMs = int(timings::kZmtpHeartbeatEvery.count());
constexpr int kHeartbeatTimeoutMs = int(timings::kZmtpTimeout.count());
// Largest message accepted; an Envelope is a few KiB at most (Event.last_lines). Guards the
// controller against a confused peer announcing a huge frame.
constexpr int64_t kMaxMsgSize = 16 << 20;
// The controller's listen queue. ZeroMQ's default, 100, overflows when a job's agents and
// workers connect at once (a new leader, thousands of them): the kernel drops their SYNs and
// they retry 1, 3, 7... s later, past the slot timeout a new leader waits for them
// (keel-bench control-plane at 16,384 ranks: 4,098 connections at once, tens of thousands
// of SYNs dropped). listen() caps it at net.core.somaxconn (4096 by default).
constexpr int kListenBacklog = 65535;

[[noreturn]] void throw_zmq(const std::string& what, const zmq::error_t& e) {
  throw Error(what + ": " + e.what() + " (zmq errno " + std::to_string(e.num()) + ")");
}

// Options both ends share.
void set_common_options(zmq::socket_t& sock) {
  sock.set(zmq::sockopt::linger, 0);
  sock.set(zmq::sockopt::maxmsgsize, kMaxMsgSize);
  sock.set(zmq::sockopt::heartbeat_ivl, kHeartbeatIvlMs);
  sock.set(zmq::sockopt::heartbeat_timeout, kHeartbeatTimeoutMs);
  sock.set(zmq::sockopt::heartbeat_ttl, kHeartbeatTimeoutMs);
}

// Waits up to `timeout` for `sock` to be readable. False on timeout and on EINTR (a signal,
// e.g. SIGCHLD in an agent: the caller simply polls again).
bool wait_readable(zmq::socket_t& sock, std::chrono::milliseconds timeout, const char* who) {
  std::array<zmq::pollitem_t, 1> items{{{sock.handle(), 0, ZMQ_POLLIN, 0}}};
  try {
    return zmq::poll(items, timeout) > 0 && (items[0].revents & ZMQ_POLLIN);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;
    throw_zmq(std::string(who) + ": poll", e);
  }
}

// Receives one whole multi-part message if one is waiting; empty if none is (EAGAIN) or a
// signal interrupted the call.
std::vector<zmq::message_t> recv_now(zmq::socket_t& sock, const char* who) {
  std::vector<zmq::message_t> parts;
  try {
    if (!zmq::recv_multipart(sock, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
      parts.clear();
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw_zmq(std::string(who) + ": receive", e);
    parts.clear();
  }
  return parts;
}

// Parses one frame into an Envelope; false for bytes that are not one or carry no body.
bool parse_envelope(const zmq::message_t& frame, control::Envelope* msg) {
  return msg->ParseFromArray(frame.data(), static_cast<int>(frame.size())) &&
         msg->body_case() != control::Envelope::BODY_NOT_SET;
}

std::string serialize(const control::Envelope& msg) {
  std::string bytes;
  KEEL_CHECK(msg.SerializeToString(&bytes), "cannot serialize control::Envelope");
  return bytes;
}

// `msg` as sent by an end that stamps `term` on everything (0: each message's own term).
std::string serialize_stamped(const control::Envelope& msg, int64_t term) {
  if (term <= 0 || msg.term() == term) return serialize(msg);
  control::Envelope stamped = msg;
  stamped.set_term(term);
  return serialize(stamped);
}

// "tcp://host:port" with IPv6 hosts in brackets, as ZeroMQ expects them.
std::string tcp_endpoint(const std::string& host, const std::string& port) {
  bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + port;
}

// A PAIR socket that receives `sock`'s `events` (zmq_socket_monitor), each as two frames: 2
// bytes of event and 4 of value, then the endpoint.
zmq::socket_t open_monitor(zmq::context_t& ctx, zmq::socket_t& sock, int events) {
  const std::string addr =
      "inproc://keel-control-monitor-" + std::to_string(reinterpret_cast<uintptr_t>(&sock));
  if (zmq_socket_monitor(sock.handle(), addr.c_str(), events) != 0)
    throw_zmq("control plane: socket monitor", zmq::error_t());
  zmq::socket_t monitor(ctx, zmq::socket_type::pair);
  monitor.set(zmq::sockopt::linger, 0);
  monitor.connect(addr);
  return monitor;
}

struct MonitorEvent {
  uint16_t event = 0;
  int32_t value = 0;     // the connection's fd, or ZeroMQ's error code
  std::string endpoint;  // the peer's address
};

// The next event waiting on a monitor socket, if any.
std::optional<MonitorEvent> next_event(zmq::socket_t& monitor) {
  for (std::vector<zmq::message_t> ev = recv_now(monitor, "control plane monitor"); !ev.empty();
       ev = recv_now(monitor, "control plane monitor")) {
    if (ev[0].size() < 6) continue;
    MonitorEvent e;
    std::memcpy(&e.event, ev[0].data(), sizeof(e.event));
    std::memcpy(&e.value, static_cast<const char*>(ev[0].data()) + 2, sizeof(e.value));
    e.endpoint = ev.size() > 1 ? ev[1].to_string() : "?";
    return e;
  }
  return std::nullopt;
}

// Every process of the job holds them, nothing else can (launcher/zap_handler.h admits only
// the client key).
CurveKeyPair curve_keys(const JobKey& key, const char* role) {
  const JobKey::Bytes seed = key.derive(std::string("keel-curve/1/") + role);
  std::array<unsigned char, crypto_box_PUBLICKEYBYTES> pk{};
  std::array<unsigned char, crypto_box_SECRETKEYBYTES> sk{};
  KEEL_CHECK(crypto_box_seed_keypair(pk.data(), sk.data(), seed.data()) == 0,
             "crypto_box_seed_keypair failed");
  return {std::string(pk.begin(), pk.end()), std::string(sk.begin(), sk.end())};
}

}  // namespace

int control_io_threads() {
  return std::clamp(int(std::thread::hardware_concurrency()) / 2, 1, 4);
}

CurveKeyPair control_curve_keys(const JobKey& key, bool server) {
  return curve_keys(key, server ? "server" : "client");
}

std::string endpoint_host(const std::string& endpoint) {
  const std::string scheme = "tcp://";
  if (endpoint.compare(0, scheme.size(), scheme) != 0)
    throw InputError("control-plane endpoint '" + endpoint + "': expected tcp://HOST:PORT");
  return parse_host_port(endpoint.substr(scheme.size())).first;
}

control::Envelope make_envelope(int epoch, int64_t term) {
  control::Envelope msg;
  msg.set_epoch(epoch);
  msg.set_term(term);
  msg.set_sent_at(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  return msg;
}

EntryCheck::Drop EntryCheck::check(const control::Envelope& msg, int64_t term, int epoch,
                                   bool known) {
  Drop why = Drop::kNone;
  switch (msg.body_case()) {
    case control::Envelope::BODY_NOT_SET:
      why = Drop::kNoBody;
      break;
    // A restarted agent registers before it has heard the term or the epoch, and keel-ctl
    // never hears them: their messages are valid at any.
    case control::Envelope::kRegistration:
    case control::Envelope::kStatusRequest:
    case control::Envelope::kInjectRequest:
    case control::Envelope::kStacksRequest:
    case control::Envelope::kReplayRequest:
    case control::Envelope::kUpdateRequest:
      break;
    default:
      if (!known)
        why = Drop::kUnknownSender;
      else if (msg.term() < term)
        why = Drop::kOlderTerm;
      else if (msg.epoch() < epoch && (msg.has_progress() || msg.has_command()))
        why = Drop::kOlderEpoch;
      break;
  }
  if (why != Drop::kNone) ++dropped_[int(why)];
  return why;
}

int64_t EntryCheck::dropped() const {
  int64_t n = 0;
  for (int64_t d : dropped_) n += d;
  return n;
}

const char* drop_name(EntryCheck::Drop d) {
  switch (d) {
    case EntryCheck::Drop::kNone:
      return "";
    case EntryCheck::Drop::kNoBody:
      return "no body";
    case EntryCheck::Drop::kOlderTerm:
      return "older term";
    case EntryCheck::Drop::kOlderEpoch:
      return "older epoch";
    case EntryCheck::Drop::kUnknownSender:
      return "unknown sender";
  }
  return "";
}

ControlServer::ControlServer(const std::string& bind_host, int port, const JobKey& key) try
    : sock_(ctx_, zmq::socket_type::router) {
  set_common_options(sock_);
  // Off (the default, set to say so): a message for a client that is gone is dropped, not
  // an EHOSTUNREACH the controller would have to handle on every send.
  sock_.set(zmq::sockopt::router_mandatory, false);
  // A client that reconnects after a partition while its old connection is not yet known
  // dead takes its identity over instead of being refused (agents name themselves by slot
  // and pid, so a second process joining as the same slot gets a name of its own).
  sock_.set(zmq::sockopt::router_handover, true);
  sock_.set(zmq::sockopt::backlog, kListenBacklog);
  // CurveZMQ: the server proves the job's server key, and the ZAP handler admits only clients
  // with the job's client key; a peer without them is refused before any message is read.
  zap_ = std::make_unique<ZapHandler>(ctx_, curve_keys(key, "client").pub);
  sock_.set(zmq::sockopt::curve_server, true);
  sock_.set(zmq::sockopt::curve_secretkey, zmq::buffer(curve_keys(key, "server").sec));
  sock_.set(zmq::sockopt::zap_domain, "keel");
  if (bind_host.find(':') != std::string::npos) sock_.set(zmq::sockopt::ipv6, true);
  std::string addr = tcp_endpoint(bind_host, port == 0 ? "*" : std::to_string(port));
  try {
    sock_.bind(addr);
  } catch (const zmq::error_t& e) {
    throw_zmq("ControlServer: cannot bind " + addr, e);
  }
  endpoint_ = sock_.get(zmq::sockopt::last_endpoint);
  port_ = std::stoi(endpoint_.substr(endpoint_.rfind(':') + 1));
  // Closed connections, for the controller to see a dead agent at once instead of at its
  // heartbeat timeout. A ROUTER does not say which peer a connection was (ZMQ_ROUTER_NOTIFY
  // is draft API, absent from Debian's libzmq); the file descriptor ties the two: every
  // message carries its connection's (ZMQ_SRCFD), and the monitor's event names it.
  // Failed handshakes too: a plain ZeroMQ client or random bytes never reach the ZAP handler.
  monitor_ = open_monitor(ctx_, sock_,
                          ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                              ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL);
} catch (const zmq::error_t& e) {
  throw_zmq("ControlServer on " + bind_host + ":" + std::to_string(port), e);
}

void ControlServer::drain_monitor() {
  while (const std::optional<MonitorEvent> e = next_event(monitor_)) {
    const uint16_t event = e->event;
    const int32_t fd = e->value;
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
        event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
      // The value is ZeroMQ's protocol error code.
      hold_refusal(
          {e->endpoint, event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                            ? detail::concat("not a CurveZMQ handshake of this job (ZMTP error 0x",
                                             std::hex, fd, ")")
                            : std::string("the connection failed during the handshake")});
      continue;
    }
    if (event != ZMQ_EVENT_DISCONNECTED) continue;
    auto it = fd_identity_.find(fd);
    if (it == fd_identity_.end()) continue;
    if (identity_fd_[it->second] == fd) {
      closed_.push_back(it->second);
      identity_fd_.erase(it->second);
    }
    fd_identity_.erase(it);
  }
}

void ControlServer::hold_refusal(Refusal r) {
  constexpr size_t kMaxHeld = 64;  // a flood between two reports is counted, not kept
  if (handshake_refused_.size() < kMaxHeld)
    handshake_refused_.push_back(std::move(r));
  else
    handshake_refused_.back().more += 1 + r.more;
}

std::vector<Refusal> ControlServer::take_refused() {
  drain_monitor();
  for (Refusal& r : zap_->take_refused()) hold_refusal(std::move(r));
  // A flood of intruders (a refused client retries every 100 ms) is one report a second at
  // most: the oldest refusal held, the others counted in its `more`.
  const auto now = std::chrono::steady_clock::now();
  if (handshake_refused_.empty() || now - last_refusal_report_ < std::chrono::seconds(1)) return {};
  last_refusal_report_ = now;
  Refusal first = handshake_refused_.front();
  for (size_t i = 1; i < handshake_refused_.size(); ++i)
    first.more += 1 + handshake_refused_[i].more;
  handshake_refused_.clear();
  return {first};
}

std::vector<std::string> ControlServer::take_closed() {
  drain_monitor();
  return std::exchange(closed_, {});
}

std::optional<ControlServer::Incoming> ControlServer::poll(std::chrono::milliseconds timeout) {
  if (!wait_readable(sock_, timeout, "ControlServer")) return std::nullopt;
  std::vector<zmq::message_t> parts = recv_now(sock_, "ControlServer");
  if (parts.empty()) return std::nullopt;
  // A DEALER's message arrives as [identity, payload]. Tolerate the empty delimiter frame a
  // REQ socket would add, but nothing else.
  bool delimited = parts.size() == 3 && parts[1].size() == 0;
  Incoming in;
  if ((parts.size() != 2 && !delimited) || !parse_envelope(parts.back(), &in.msg)) {
    ++malformed_;
    return std::nullopt;
  }
  in.identity = parts[0].to_string();
  // The connection it came on (deprecated in favour of draft API only; see the constructor).
  const int fd = zmq_msg_get(parts.back().handle(), ZMQ_SRCFD);
  if (fd >= 0) {
    // A connection not yet tied to this identity: its fd may be a closed connection's, whose
    // close event must be read before the fd is tied again.
    if (auto known = fd_identity_.find(fd);
        known == fd_identity_.end() || known->second != in.identity)
      drain_monitor();
    // A connection's messages come in order; its close event comes after them all. A
    // message of a newer connection makes it the identity's.
    if (auto old = identity_fd_.find(in.identity); old != identity_fd_.end() && old->second != fd)
      fd_identity_.erase(old->second);
    identity_fd_[in.identity] = fd;
    fd_identity_[fd] = in.identity;
  }
  return in;
}

bool ControlServer::send(const std::string& identity, const control::Envelope& msg) {
  const std::string bytes = serialize_stamped(msg, term_);
  try {
    // The identity frame is where ZeroMQ decides whether the message can be queued; once it
    // is accepted, the payload frame always is.
    if (!sock_.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return false;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;  // nothing was queued; the caller may retry
    throw_zmq("ControlServer: send to " + identity, e);
  }
  try {
    return sock_.send(zmq::buffer(bytes), zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t& e) {
    throw_zmq("ControlServer: send to " + identity, e);
  }
}

ControlClient::ControlClient(const std::string& endpoint, const std::string& identity,
                             const JobKey& key) try
    : sock_(ctx_, zmq::socket_type::dealer), identity_(identity) {
  set_common_options(sock_);
  sock_.set(zmq::sockopt::routing_id, identity);
  const CurveKeyPair mine = curve_keys(key, "client");
  sock_.set(zmq::sockopt::curve_serverkey, zmq::buffer(curve_keys(key, "server").pub));
  sock_.set(zmq::sockopt::curve_publickey, zmq::buffer(mine.pub));
  sock_.set(zmq::sockopt::curve_secretkey, zmq::buffer(mine.sec));
  sock_.set(zmq::sockopt::reconnect_ivl, kReconnectIvlMs);
  sock_.set(zmq::sockopt::reconnect_ivl_max, 0);  // no exponential backoff
  if (endpoint.find('[') != std::string::npos) sock_.set(zmq::sockopt::ipv6, true);
  monitor_ = open_monitor(ctx_, sock_,
                          ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                              ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
  try {
    sock_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw_zmq("ControlClient " + identity + ": cannot connect to " + endpoint, e);
  }
} catch (const zmq::error_t& e) {
  throw_zmq("ControlClient " + identity + " for " + endpoint, e);
}

bool ControlClient::send(const control::Envelope& msg) {
  const std::string bytes = serialize_stamped(msg, term_);
  try {
    return sock_.send(zmq::buffer(bytes), zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;
    throw_zmq("ControlClient " + identity_ + ": send", e);
  }
}

std::optional<control::Envelope> ControlClient::poll(std::chrono::milliseconds timeout) {
  if (!wait_readable(sock_, timeout, "ControlClient")) return std::nullopt;
  std::vector<zmq::message_t> parts = recv_now(sock_, "ControlClient");
  if (parts.empty()) return std::nullopt;
  control::Envelope msg;
  if (parts.size() != 1 || !parse_envelope(parts[0], &msg)) {
    ++malformed_;
    return std::nullopt;
  }
  return msg;
}

void ControlClient::drain_monitor() {
  while (const std::optional<MonitorEvent> e = next_event(monitor_)) {
    if (e->event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      ++connections_;
      continue;
    }
    refused_ = e->event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                   ? detail::concat("the controller refused this process's key (ZAP status ",
                                    e->value, "): not the job's secret")
                   : "the CurveZMQ handshake with the controller failed: it holds another "
                     "job's keys (a wrong secret), or is no keel controller";
  }
}

std::string ControlClient::handshake_refused() {
  drain_monitor();
  return refused_;
}

int64_t ControlClient::connections() {
  drain_monitor();
  return connections_;
}

bool ControlClient::queued() {
  return (sock_.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
}

std::optional<control::Envelope> ControlClient::request(const control::Envelope& msg,
                                                        std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  // A reply that arrived after an earlier request gave up must not answer this one.
  while (!recv_now(sock_, "ControlClient").empty()) {
  }
  if (!send(msg)) return std::nullopt;
  // poll() also returns early on a signal or a malformed message: keep waiting until the
  // deadline.
  for (auto now = Clock::now(); now < deadline; now = Clock::now()) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    if (auto reply = poll(left)) return reply;
  }
  return std::nullopt;
}

}  // namespace keel
