// The control-plane transport of a multi-machine job (see ../shared/DESIGN.md, Processes):
// the controller's ControlServer (a ZeroMQ ROUTER) and the ControlClients (DEALERs) of the
// agents, workers and keel-ctl, each message one serialized control::Envelope
// (proto/control.proto). Every connection is CurveZMQ, encrypted and authenticated with
// keys derived from the job key (parallel/job_key.h): a peer without them is refused before
// any message is read (launcher/zap_handler.h). Nothing here blocks without a bound: a peer that
// died, never came, or is cut off by a partition costs a dropped message or a timeout, never a
// hang.
//
// Thread-safety: like the ZeroMQ socket it owns, a ControlServer or ControlClient is used by
// one thread at a time. A process that sends from a background thread (a worker's progress
// heartbeat) gives that thread its own ControlClient, with its own identity.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "launcher/zap_handler.h"
#include "parallel/job_key.h"
#include "proto/control.pb.h"

namespace keel {

// The host of a control-plane endpoint ("tcp://host:port"; IPv6 hosts in brackets). Throws
// keel::InputError naming the endpoint if it is not one.
std::string endpoint_host(const std::string& endpoint);

// A fresh Envelope of `epoch` and leader `term`, sent_at stamped with the current unix time in
// seconds.
control::Envelope make_envelope(int epoch, int64_t term = 0);

// The check at the door, as etcd raft's Step does it: every message says the leader term and
// the membership epoch it was made under, and one that is stale is dropped (and counted by
// reason) before any handler sees it, so that no handler asks "is this still true?":
//   - an older term than the receiver knows from etcd: a deposed leader's (or a message made
//     for one);
//   - an older epoch, for what is about the ranks (progress, commands): a newer epoch is
//     accepted, the receiver is the one behind;
//   - a sender the receiver does not know, where it must know it (an agent's message before
//     it registered);
//   - no body.
// A Register (a restarted agent knows neither yet) and keel-ctl's requests (it never knows
// them) are valid at any term and epoch.
class EntryCheck {
 public:
  enum class Drop { kNone = 0, kNoBody, kOlderTerm, kOlderEpoch, kUnknownSender };
  static constexpr int kDropKinds = 5;

  // Why `msg` must be dropped by a receiver that knows `term` and `epoch` and whose sender is
  // `known` (or not) to it; kNone: handle it. Counts every drop.
  Drop check(const control::Envelope& msg, int64_t term, int epoch, bool known = true);
  bool admit(const control::Envelope& msg, int64_t term, int epoch, bool known = true) {
    return check(msg, term, epoch, known) == Drop::kNone;
  }
  // Messages dropped so far, for one reason or all of them.
  int64_t dropped(Drop why) const { return dropped_[int(why)]; }
  int64_t dropped() const;

 private:
  int64_t dropped_[kDropKinds] = {};
};
// "no body", "older term", "older epoch", "unknown sender" ("" for kNone).
const char* drop_name(EntryCheck::Drop d);

// The job's CurveZMQ key pairs (32 bytes each), derived from its job key: the server's and
// the one every client of the job uses. For ControlServer/ControlClient, and for tests that
// speak raw ZeroMQ to them.
struct CurveKeyPair {
  std::string pub, sec;
};
CurveKeyPair control_curve_keys(const JobKey& key, bool server);

// The ZeroMQ I/O threads of a ControlServer: half the cores, 1 to 4.
int control_io_threads();

// The controller's end: a ROUTER that any number of clients connect to. Each incoming
// message names its sender's identity, which send() uses to answer that one client.
class ControlServer {
 public:
  // One received message and the identity of the client that sent it.
  struct Incoming {
    std::string identity;
    control::Envelope msg;
  };

  // Binds to tcp://bind_host:port (port 0: an ephemeral port; bind_host may be "*", an IPv4
  // or an IPv6 address). Throws keel::Error naming the address if it cannot be bound.
  // `key`: the job key its CURVE keys derive from (parallel/job_key.h).
  ControlServer(const std::string& bind_host, int port, const JobKey& key = process_job_key());
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // The bound endpoint with its real port, e.g. "tcp://10.0.0.1:41234".
  const std::string& endpoint() const { return endpoint_; }
  int port() const { return port_; }

  // Waits up to `timeout` for a message. nullopt on timeout, on a signal interrupting the
  // wait, and on a malformed message (wrong frames, not an Envelope, no body), which is
  // dropped and counted in malformed(). Never throws for what a peer sent.
  std::optional<Incoming> poll(std::chrono::milliseconds timeout);

  // Queues `msg` for the client `identity` without blocking. A client that is unknown or
  // gone is dropped silently (it may be dead; the caller learns that from heartbeats).
  // Returns false if the message could not be queued (the peer's queue is full, or a signal
  // interrupted the call).
  bool send(const std::string& identity, const control::Envelope& msg);
  // The leader term stamped on every message sent from now on (0: leave each message's own):
  // the controller's, so that no message of it goes out without the term it leads in.
  void set_term(int64_t term) { term_ = term; }

  // Messages poll() dropped because they were not a well-formed Envelope.
  int64_t malformed() const { return malformed_; }

  // The identities whose connection closed since the last call, each once, oldest first:
  // a client whose process died (its kernel closes the socket at once), one that reset its
  // connection, and one silent past the ZMTP heartbeat timeout. A client known only by
  // messages from an earlier connection is named once its newest connection closes.
  std::vector<std::string> take_closed();

  // The connections refused (no job key: a wrong CURVE key, a plain ZeroMQ client, bytes
  // that are no handshake) since the last report, at most one report a second: the oldest
  // refusal, the others counted in its `more`. For the controller's `refused` events.
  std::vector<Refusal> take_refused();

 private:
  void drain_monitor();
  void hold_refusal(Refusal r);

  // I/O threads: each CURVE handshake costs the server Curve25519 work in one of them
  // (keel-bench control-plane: 4,098 connections at once register in 1.1 s on one thread,
  // 0.24 s without CURVE), so a takeover's rush of connections uses up to 4 cores.
  zmq::context_t ctx_{control_io_threads()};
  std::unique_ptr<ZapHandler> zap_;  // before sock_: destroyed after it, before ctx_
  zmq::socket_t sock_;
  zmq::socket_t monitor_;  // the ROUTER's socket monitor: connection closed events
  std::string endpoint_;
  int port_ = 0;
  int64_t malformed_ = 0;
  int64_t term_ = 0;
  // Each identity's newest connection (its file descriptor, ZMQ_SRCFD of its messages), and
  // back: a closed connection names the identity only while it is the identity's newest.
  std::map<std::string, int> identity_fd_;
  std::map<int, std::string> fd_identity_;
  std::vector<std::string> closed_;
  std::vector<Refusal> handshake_refused_;  // refusals not reported yet
  std::chrono::steady_clock::time_point last_refusal_report_{};
};

// An agent's, worker's or keel-ctl's end: a DEALER connected to the controller. Connecting
// never fails for a server that is not there yet or has gone: ZeroMQ reconnects every
// 50 ms in the background, and messages sent meanwhile wait in a bounded queue.
class ControlClient {
 public:
  // Connects to `endpoint` ("tcp://host:port", as ControlServer::endpoint() gives it) under
  // `identity` ("agent/3/<pid>", "worker/12", "ctl/<pid>"): the name the server answers to. A
  // client that reconnects under an identity already known to the server takes it over.
  // Throws keel::Error if the endpoint is malformed.
  // `key`: the job key its CURVE keys derive from; a client of another key is refused.
  ControlClient(const std::string& endpoint, const std::string& identity,
                const JobKey& key = process_job_key());
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  const std::string& identity() const { return identity_; }

  // Queues `msg` for the server without blocking. Returns false if it could not be queued
  // (the queue, 1000 messages, is full because the server has been unreachable for a long
  // time; or a signal interrupted the call).
  bool send(const control::Envelope& msg);
  // The leader term stamped on every message sent from now on (0: leave each message's own):
  // an agent's, the newest etcd confirmed to it.
  void set_term(int64_t term) { term_ = term; }

  // Waits up to `timeout` for a message from the server; nullopt on timeout, on a signal,
  // or on a malformed message (dropped, counted in malformed()).
  std::optional<control::Envelope> poll(std::chrono::milliseconds timeout);

  // keel-ctl's call: discards any message already waiting (a late answer to an earlier
  // request), sends `msg`, and returns the first message that arrives within `timeout`, or
  // nullopt if none does (no controller, or it did not answer).
  std::optional<control::Envelope> request(const control::Envelope& msg,
                                           std::chrono::milliseconds timeout);

  int64_t malformed() const { return malformed_; }

  // Whether a message from the server is waiting to be read, without reading it.
  bool queued();

  // Why the server refused this client's CURVE handshake (another job's keys, or no keel
  // server), if it has since the client started; empty if it has not. For keel-ctl to say
  // so instead of "no answer".
  std::string handshake_refused();

  // Connections made to the server so far (CurveZMQ handshakes that succeeded): one more each
  // time the client reconnects after its connection closed. An agent heartbeats at once when
  // it grows, so that the controller sees a reset link come back within its grace
  // (launcher/controller/agent_host_liveness.cc) rather than at the next heartbeat.
  int64_t connections();

 private:
  int64_t term_ = 0;
  zmq::context_t ctx_{1};
  zmq::socket_t sock_;
  void drain_monitor();

  zmq::socket_t monitor_;  // failed and succeeded handshakes
  std::string refused_;
  int64_t connections_ = 0;
  std::string identity_;
  int64_t malformed_ = 0;
};

}  // namespace keel
