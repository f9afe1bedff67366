#include "launcher/zap_handler.h"

#include <sodium.h>

#include <array>
#include <iterator>
#include <utility>

#include <zmq_addon.hpp>

#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// A bound on what the controller keeps between two reads of its refusals (a flood of
// intruders is folded into the last entry's count).
constexpr size_t kMaxKept = 64;

}  // namespace

ZapHandler::ZapHandler(zmq::context_t& ctx, std::string client_key)
    : client_key_(std::move(client_key)) {
  KEEL_CHECK(client_key_.size() == 32, "ZAP handler: a CURVE key is 32 bytes");
  zmq::socket_t sock(ctx, zmq::socket_type::rep);
  sock.set(zmq::sockopt::linger, 0);
  sock.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this, s = std::move(sock)]() mutable { serve(std::move(s)); });
}

ZapHandler::~ZapHandler() {
  stop_ = true;
  thread_.join();
}

std::vector<Refusal> ZapHandler::take_refused() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(refused_, {});
}

void ZapHandler::serve(zmq::socket_t sock) {
  std::array<zmq::pollitem_t, 1> items{{{sock.handle(), 0, ZMQ_POLLIN, 0}}};
  while (!stop_) {
    try {
      // Polled in slices so that the destructor's stop is seen; a request waits at most a
      // slice only when the server had nothing else to do.
      if (zmq::poll(items, std::chrono::milliseconds(100)) <= 0) continue;
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(sock, std::back_inserter(req), zmq::recv_flags::dontwait)) continue;
      // version, request id, domain, address, identity, mechanism, credentials...
      if (req.size() < 6) continue;  // not from libzmq; nothing to answer
      const std::string mechanism = req[5].to_string();
      const std::string address = req[3].to_string();
      std::string why;
      if (mechanism != "CURVE")
        why = "mechanism " + mechanism + " (the control plane takes CURVE only)";
      else if (req.size() < 7 || req[6].size() != 32 ||
               sodium_memcmp(req[6].data(), client_key_.data(), 32) != 0)
        why = "a CURVE key that is not this job's";
      const bool ok = why.empty();
      std::array<zmq::message_t, 6> reply{zmq::message_t(std::string("1.0")),
                                          zmq::message_t(req[1].data(), req[1].size()),
                                          zmq::message_t(std::string(ok ? "200" : "400")),
                                          zmq::message_t(std::string(ok ? "OK" : why)),
                                          zmq::message_t(std::string(ok ? "job" : "")),
                                          zmq::message_t()};
      zmq::send_multipart(sock, reply);
      if (ok) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (refused_.size() < kMaxKept)
        refused_.push_back({address, why});
      else
        ++refused_.back().more;
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      // A thread has no caller to throw to, and without it no client could connect.
      if (e.num() != EINTR) LOG(ERROR) << "ZAP handler: " << e.what();
    }
  }
}

}  // namespace keel
