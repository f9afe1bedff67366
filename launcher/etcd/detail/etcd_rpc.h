// Inside EtcdClient: the gRPC channel and stubs, and the one way a call is made (deadline,
// retries, typed errors). Shared by etcd_client.cc and etcd_watch.cc only.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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

// One member's connection: a channel of its own, so that a member cut off from the rest
// (its TCP connection open, its packets dropped) is passed over after one failed attempt
// instead of holding every call until gRPC's keepalive notices (7 s). One channel over all
// members (pick_first) stays on the member it connected to as long as that connection looks
// up, as etcd's own Go client does not.
struct EtcdMemberChannel {
  std::string name;  // "h:p"
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  std::unique_ptr<etcdserverpb::Cluster::Stub> cluster;
};

// The members calls go to, as one immutable set: the endpoints the client was given, or the
// members etcd listed last (EtcdClient::Impl::follow). A call, or a watch's stream, holds the
// set it started with; a newer one replaces it whole.
struct EtcdChannels {
  std::vector<std::shared_ptr<EtcdMemberChannel>> list;
  std::vector<std::string> endpoints;  // as endpoints() gives them ("https://h:p" or "h:p")
  std::string names;                   // "h1:p1,h2:p2,..." for messages
};

struct EtcdClient::Impl {
  std::chrono::milliseconds attempt;  // one try of a call (call())
  std::atomic<std::shared_ptr<const EtcdChannels>> channels;
  std::atomic<size_t> current{0};  // the member calls go to until one fails
  // Runs when a call passes a member over (the client looks at etcd's members again).
  std::function<void()> on_pass_over;
  // What a member's channel is made with (a new member's too).
  grpc::ChannelArguments args;
  std::shared_ptr<grpc::ChannelCredentials> tls;

  std::shared_ptr<const EtcdChannels> channels_now() const { return channels.load(); }

  // A channel to the member at "h:p".
  std::shared_ptr<EtcdMemberChannel> open(const std::string& host_port, bool with_tls) const;

  // Throws the typed error for a failed call `what`.
  [[noreturn]] void fail(const std::string& what, const grpc::Status& status,
                         std::chrono::milliseconds waited) const;

  // The member calls go to now, and its index in `ch` (for pass_over): the current one while
  // its connection is up; else the next one whose is (a member that died refuses
  // connections, and is passed over at once). When none is up yet (a new client, members
  // restarting), it waits until `until` for the first that connects, so that a new client
  // does not spend its first call on a dead member; then the next one still trying, else the
  // current one.
  EtcdMemberChannel& member(const EtcdChannels& ch, size_t* index,
                            std::chrono::steady_clock::time_point until) {
    const auto& members = ch.list;
    const size_t n = members.size();
    for (;;) {
      size_t start = current.load() % n, trying = n;
      for (size_t k = 0; k < n; ++k) {
        const size_t i = (start + k) % n;
        const grpc_connectivity_state s = members[i]->channel->GetState(/*try_to_connect=*/true);
        if (s == GRPC_CHANNEL_READY) {
          if (k > 0) current.compare_exchange_strong(start, i);
          *index = i;
          return *members[i];
        }
        if (trying == n && s != GRPC_CHANNEL_TRANSIENT_FAILURE && s != GRPC_CHANNEL_SHUTDOWN)
          trying = i;
      }
      if (trying == n || std::chrono::steady_clock::now() >= until) {
        *index = trying == n ? start : trying;
        return *members[*index];
      }
      // Waiting on a channel polls the connections (gRPC's synchronous API makes progress
      // on the calling thread): a sleep would leave them where they are.
      const auto step =
          std::min(until, std::chrono::steady_clock::now() + std::chrono::milliseconds(5));
      members[trying]->channel->WaitForStateChange(
          members[trying]->channel->GetState(false),
          std::chrono::system_clock::now() + (step - std::chrono::steady_clock::now()));
    }
  }
  // Member `index` of `ch` failed a call: the next one is tried (once, if several calls
  // failed on it at the same time).
  void pass_over(const EtcdChannels& ch, size_t index) {
    if (on_pass_over) on_pass_over();
    const size_t n = ch.list.size();
    size_t seen = current.load();
    if (seen % n == index) current.compare_exchange_strong(seen, (index + 1) % n);
  }

  // Runs rpc(context, member) -> grpc::Status until it succeeds or `deadline` passes. Tried
  // on the next member, after a short backoff once every member was tried, as long as the
  // deadline allows: the member's connection broke or it has no leader (UNAVAILABLE), or an
  // attempt took longer than `attempt`: the member may be cut off, or a write forwarded to a
  // Raft leader that just died is lost (the member would give up on it only after its own
  // request timeout, 7 s for keel's members, while a new leader is there within 1-2 s).
  // A call made while its member's channel reconnects waits for it (wait_for_ready) within
  // the attempt: failing at once instead leaves a channel that is still in its first
  // connection's backoff (a member starting up) failing every call.
  // A try that timed out has an unknown outcome: a member that froze with it may carry it
  // out when it thaws (gRPC deadlines count from arrival), after a later write. Fenced writes
  // are still refused once another controller leads.
  template <typename Rpc>
  void call(const std::string& what, std::chrono::steady_clock::time_point deadline, Rpc&& rpc) {
    using std::chrono::milliseconds;
    const auto start = std::chrono::steady_clock::now();
    auto backoff = milliseconds(20);
    const std::shared_ptr<const EtcdChannels> ch = channels_now();
    for (size_t tried = 1;; ++tried) {
      grpc::ClientContext context;
      set_deadline(context, std::min(deadline, std::chrono::steady_clock::now() + attempt));
      context.set_wait_for_ready(true);
      size_t index = 0;
      EtcdMemberChannel& m =
          member(*ch, &index, std::min(deadline, std::chrono::steady_clock::now() + attempt));
      const grpc::Status status = rpc(context, m);
      if (status.ok()) return;
      const auto now = std::chrono::steady_clock::now();
      if (!out_of_reach(status))
        fail(what, status, std::chrono::duration_cast<milliseconds>(now - start));
      pass_over(*ch, index);
      const bool round_done = tried % ch->list.size() == 0;
      if (now + (round_done ? backoff : milliseconds(0)) >= deadline)
        fail(what, status, std::chrono::duration_cast<milliseconds>(now - start));
      if (round_done) {
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, milliseconds(200));
      }
    }
  }

  // The cluster is out of reach (no member answered, or the one that did has no leader),
  // not refusing the call: tried again, and EtcdUnavailable at the deadline. A member
  // without a leader answers some calls itself with its own timeout (gRPC UNKNOWN "context
  // deadline exceeded", "request timed out"), and a write that reaches a member with no
  // leader, or a leader handing its leadership over (MoveLeader), is dropped at once ("raft
  // proposal dropped").
  static bool out_of_reach(const grpc::Status& status) {
    const auto code = status.error_code();
    if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED)
      return true;
    const std::string& m = status.error_message();
    return code == grpc::StatusCode::UNKNOWN && (m.find("deadline exceeded") != std::string::npos ||
                                                 m.find("request timed out") != std::string::npos ||
                                                 m.find("no leader") != std::string::npos ||
                                                 m.find("leader changed") != std::string::npos ||
                                                 m.find("proposal dropped") != std::string::npos);
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
