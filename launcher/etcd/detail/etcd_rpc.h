// Inside EtcdClient: the gRPC channel and stubs, and the one way a call is made (deadline,
// retries, typed errors). Shared by etcd_client.cc and etcd_watch.cc only.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "launcher/etcd/etcd_client.h"

namespace keel {

// The end of the range of every key that starts with `prefix`: the prefix with its last
// byte below 0xff incremented ("\0" means "to the end": every key).
inline std::string etcd_prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

struct EtcdClient::Impl {
  std::string target;                 // "ipv4:h1:p1,h2:p2,..."
  std::string names;                  // "h1:p1,h2:p2,..." for messages
  std::chrono::milliseconds attempt;  // one try of a call (call())
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  std::unique_ptr<etcdserverpb::Cluster::Stub> cluster;

  // Throws the typed error for a failed call `what`.
  [[noreturn]] void fail(const std::string& what, const grpc::Status& status,
                         std::chrono::milliseconds waited) const;

  // Runs rpc(context) -> grpc::Status until it succeeds or `deadline` passes. Retried, after
  // a short backoff, as long as the deadline allows: the member's connection broke or it has
  // no leader (UNAVAILABLE), or an attempt took longer than `attempt`: a write forwarded to a
  // Raft leader that just died is lost, and the member would only give up on it after its
  // own request timeout (7 s for keel's members), while a new leader is there within 1-2 s.
  // wait_for_ready: a call made while the channel reconnects (its member died) waits for the
  // next member instead of failing at once.
  template <typename Rpc>
  void call(const std::string& what, std::chrono::steady_clock::time_point deadline, Rpc&& rpc) {
    using std::chrono::milliseconds;
    const auto start = std::chrono::steady_clock::now();
    auto backoff = milliseconds(20);
    for (;;) {
      grpc::ClientContext context;
      set_deadline(context, std::min(deadline, std::chrono::steady_clock::now() + attempt));
      context.set_wait_for_ready(true);
      const grpc::Status status = rpc(context);
      if (status.ok()) return;
      const auto now = std::chrono::steady_clock::now();
      if (!out_of_reach(status) || now + backoff >= deadline)
        fail(what, status, std::chrono::duration_cast<milliseconds>(now - start));
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, milliseconds(200));
    }
  }

  // The cluster is out of reach (no member answered, or the one that did has no leader),
  // not refusing the call: tried again, and EtcdUnavailable at the deadline. A member
  // without a leader answers some calls itself with its own timeout (gRPC UNKNOWN "context
  // deadline exceeded", "request timed out").
  static bool out_of_reach(const grpc::Status& status) {
    const auto code = status.error_code();
    if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED)
      return true;
    const std::string& m = status.error_message();
    return code == grpc::StatusCode::UNKNOWN && (m.find("deadline exceeded") != std::string::npos ||
                                                 m.find("request timed out") != std::string::npos ||
                                                 m.find("no leader") != std::string::npos);
  }

  static void set_deadline(grpc::ClientContext& context,
                           std::chrono::steady_clock::time_point deadline) {
    // gRPC takes wall-clock deadlines; keel measures on the steady clock.
    const auto left = deadline - std::chrono::steady_clock::now();
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::duration_cast<std::chrono::system_clock::duration>(left));
  }
};

}  // namespace keel
