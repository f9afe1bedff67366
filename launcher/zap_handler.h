// The ZAP handler of a ControlServer's ZeroMQ context (ZeroMQ RFC 27): CURVE authenticates
// the server to its clients, but without a handler it accepts a client of any key. This one
// admits exactly the job's client key (derived from the job key, parallel/job_key.h) and
// records every refusal, with the peer's address and why, for the controller's event log.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

namespace keel {

// One refused control-plane connection.
struct Refusal {
  std::string peer;  // "1.2.3.4" (ZAP) or "tcp://1.2.3.4:5678" (a failed handshake)
  std::string why;
  int64_t more = 0;  // refusals folded into this one (see ControlServer::take_refused)
};

class ZapHandler {
 public:
  // Binds inproc://zeromq.zap.01 in `ctx` (call before the server socket binds) and answers
  // from a thread of its own until destroyed. `client_key` is the 32-byte CURVE public key
  // to admit.
  ZapHandler(zmq::context_t& ctx, std::string client_key);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  // The refusals since the last call, oldest first.
  std::vector<Refusal> take_refused();

 private:
  void serve(zmq::socket_t sock);

  std::string client_key_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Refusal> refused_;
  std::thread thread_;
};

}  // namespace keel
