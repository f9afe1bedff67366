// EtcdClient's calls on the cluster itself (launcher/etcd/etcd_client.h; runs in whichever
// process holds the client): the members' Raft status, a move of Raft leadership, and the
// membership changes by which EtcdUpkeep replaces a lost member. The keys and leases are
// etcd_client.cc's.
#include <algorithm>
#include <string>
#include <vector>

#include "launcher/etcd/detail/etcd_rpc.h"
#include "launcher/etcd/etcd_client.h"

namespace keel {

namespace {

using std::chrono::steady_clock;

// What a member's Status answer says, and the endpoint it came through ("" if not known).
EtcdStatus status_of(const etcdserverpb::StatusResponse& r, const std::string& endpoint) {
  return EtcdStatus{r.header().member_id(),
                    r.leader(),
                    r.raftterm(),
                    r.raftindex(),
                    r.dbsize(),
                    r.version(),
                    endpoint};
}

// The members as a MemberList or MemberAdd answer lists them.
std::vector<EtcdMemberInfo> members_of(
    const google::protobuf::RepeatedPtrField<etcdserverpb::Member>& ms) {
  std::vector<EtcdMemberInfo> out;
  for (const auto& m : ms)
    out.push_back(EtcdMemberInfo{m.id(),
                                 m.name(),
                                 {m.peerurls().begin(), m.peerurls().end()},
                                 {m.clienturls().begin(), m.clienturls().end()}});
  return out;
}

}  // namespace

EtcdStatus EtcdClient::status() {
  etcdserverpb::StatusRequest req;
  etcdserverpb::StatusResponse resp;
  impl_->call("status", steady_clock::now() + timeout_,
              [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
                return m.maintenance->Status(&c, req, &resp);
              });
  return status_of(resp, "");
}

std::vector<EtcdStatus> EtcdClient::member_statuses(steady_clock::time_point deadline) {
  // Every member asked at once: a silent one costs the deadline once, not once per member.
  struct Ask {
    grpc::ClientContext context;
    etcdserverpb::StatusResponse resp;
    std::unique_ptr<grpc::ClientAsyncResponseReader<etcdserverpb::StatusResponse>> reader;
    grpc::Status status;
  };
  grpc::CompletionQueue cq;
  const std::shared_ptr<const EtcdChannels> ch = impl_->channels_now();
  std::vector<Ask> asks(ch->list.size());
  const etcdserverpb::StatusRequest req;
  for (size_t i = 0; i < asks.size(); ++i) {
    Impl::set_deadline(asks[i].context, deadline);
    asks[i].reader = ch->list[i]->maintenance->AsyncStatus(&asks[i].context, req, &cq);
    asks[i].reader->Finish(&asks[i].resp, &asks[i].status, reinterpret_cast<void*>(i));
  }
  void* tag = nullptr;
  bool ok = false;
  size_t left = asks.size();
  while (left > 0 && cq.Next(&tag, &ok)) --left;
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  std::vector<EtcdStatus> out;
  for (size_t i = 0; i < asks.size(); ++i)
    if (asks[i].status.ok()) out.push_back(status_of(asks[i].resp, ch->list[i]->name));
  return out;
}

void EtcdClient::move_leader(const EtcdStatus& leader, uint64_t to,
                             steady_clock::time_point deadline) {
  const std::shared_ptr<const EtcdChannels> ch = impl_->channels_now();
  const auto found = std::find_if(ch->list.begin(), ch->list.end(),
                                  [&](const auto& m) { return m->name == leader.endpoint; });
  if (found == ch->list.end())
    throw EtcdError("etcd (" + ch->names + "): move leader: no endpoint '" + leader.endpoint + "'",
                    int(grpc::StatusCode::INVALID_ARGUMENT));
  EtcdMemberChannel* at = found->get();
  etcdserverpb::MoveLeaderRequest req;
  req.set_targetid(to);
  etcdserverpb::MoveLeaderResponse resp;
  grpc::ClientContext c;
  Impl::set_deadline(c, deadline);
  const grpc::Status st = at->maintenance->MoveLeader(&c, req, &resp);
  if (!st.ok())
    impl_->fail(
        "move leader to " + std::to_string(to), st,
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady_clock::now()));
}

std::vector<EtcdMemberInfo> EtcdClient::member_list() {
  return member_list_within(steady_clock::now() + timeout_);
}

std::vector<EtcdMemberInfo> EtcdClient::member_list_within(steady_clock::time_point deadline) {
  etcdserverpb::MemberListRequest req;
  etcdserverpb::MemberListResponse resp;
  impl_->call("member list", deadline, [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
    return m.cluster->MemberList(&c, req, &resp);
  });
  return members_of(resp.members());
}

std::vector<EtcdMemberInfo> EtcdClient::member_add(const std::string& peer_url, uint64_t* id) {
  etcdserverpb::MemberAddRequest req;
  req.add_peerurls(peer_url);
  etcdserverpb::MemberAddResponse resp;
  grpc::ClientContext c;
  Impl::set_deadline(c, steady_clock::now() + timeout_);
  // Not retried (a second add of the same member is refused): the next call goes elsewhere.
  size_t index = 0;
  const std::shared_ptr<const EtcdChannels> ch = impl_->channels_now();
  const grpc::Status s = impl_->member(*ch, &index, steady_clock::now() + impl_->attempt)
                             .cluster->MemberAdd(&c, req, &resp);
  if (!s.ok()) {
    if (Impl::out_of_reach(s)) impl_->pass_over(*ch, index);
    impl_->fail("member add " + peer_url, s, timeout_);
  }
  ++writes_;
  if (id) *id = resp.member().id();
  return members_of(resp.members());
}

void EtcdClient::member_remove(uint64_t id) {
  etcdserverpb::MemberRemoveRequest req;
  req.set_id(id);
  etcdserverpb::MemberRemoveResponse resp;
  grpc::ClientContext c;
  Impl::set_deadline(c, steady_clock::now() + timeout_);
  // Not retried (a second add of the same member is refused): the next call goes elsewhere.
  size_t index = 0;
  const std::shared_ptr<const EtcdChannels> ch = impl_->channels_now();
  const grpc::Status s = impl_->member(*ch, &index, steady_clock::now() + impl_->attempt)
                             .cluster->MemberRemove(&c, req, &resp);
  if (!s.ok()) {
    if (Impl::out_of_reach(s)) {
      impl_->pass_over(*ch, index);
      // A member asked to remove itself stops as it applies the change, and may answer
      // "server stopped" instead of the response: the removal went through if the others list
      // it no more (asked through them: this one was passed over).
      try {
        const std::vector<EtcdMemberInfo> now = member_list();
        if (std::none_of(now.begin(), now.end(),
                         [id](const EtcdMemberInfo& m) { return m.id == id; })) {
          ++writes_;
          return;
        }
      } catch (const EtcdError&) {
      }
    }
    impl_->fail("member remove", s, timeout_);
  }
  ++writes_;
}

}  // namespace keel
