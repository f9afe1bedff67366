#include "launcher/etcd/etcd_client.h"

#include <arpa/inet.h>
#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "launcher/etcd/detail/etcd_rpc.h"
#include "launcher/etcd/etcd_tls.h"
#include "launcher/processes.h"

namespace keel {

namespace {

using std::chrono::steady_clock;

// A look at the members waits this long at most: the client's owner may be ending (its
// destructor waits for the look in flight).
constexpr std::chrono::milliseconds kFollowCallAtMost{500};
// Looks come no closer together than this, however often calls fail over.
constexpr std::chrono::seconds kFollowAtMostEvery{1};

// "https://1.2.3.4:2379" (a member keel started: TLS with the job's certificates),
// "http://1.2.3.4:2379" or "1.2.3.4:2379" (plain) -> "1.2.3.4:2379"; anything else is refused
// here, not found out by a gRPC resolver later.
std::string host_port(const std::string& endpoint, bool* tls) {
  std::string s = endpoint;
  *tls = s.starts_with(kEtcdTlsScheme);
  if (*tls) s = s.substr(std::strlen(kEtcdTlsScheme));
  if (s.starts_with("http://")) s = s.substr(7);
  const size_t colon = s.rfind(':');
  in_addr addr{};
  if (colon == std::string::npos || ::inet_pton(AF_INET, s.substr(0, colon).c_str(), &addr) != 1)
    throw InputError("etcd endpoint '" + endpoint + "': expected host:port, host an IPv4 address");
  const std::string port = s.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) == 0 || std::stoul(port) > 65535)
    throw InputError("etcd endpoint '" + endpoint + "': bad port");
  return s;
}

EtcdKeyValue from_proto(const mvccpb::KeyValue& kv) {
  return EtcdKeyValue{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()};
}

// Guard: the key's create revision equals the guard's (0 for a key that must not exist).
void add_guard(etcdserverpb::TxnRequest& txn, const EtcdGuard& guard) {
  KEEL_CHECK(!guard.key.empty(), "an etcd guard needs a key");
  etcdserverpb::Compare* c = txn.add_compare();
  c->set_result(etcdserverpb::Compare::EQUAL);
  c->set_target(etcdserverpb::Compare::CREATE);
  c->set_key(guard.key);
  c->set_create_revision(guard.create_revision);
}

}  // namespace

std::shared_ptr<EtcdMemberChannel> EtcdClient::Impl::open(const std::string& host_port,
                                                          bool with_tls) const {
  auto m = std::make_shared<EtcdMemberChannel>();
  m->name = host_port;
  grpc::ChannelArguments a = args;
  // Members are reached by address; their certificates all name kEtcdServerName.
  if (with_tls) a.SetSslTargetNameOverride(kEtcdServerName);
  m->channel = grpc::CreateCustomChannel("ipv4:" + host_port,
                                         with_tls ? tls : grpc::InsecureChannelCredentials(), a);
  m->kv = etcdserverpb::KV::NewStub(m->channel);
  m->lease = etcdserverpb::Lease::NewStub(m->channel);
  m->watch = etcdserverpb::Watch::NewStub(m->channel);
  m->maintenance = etcdserverpb::Maintenance::NewStub(m->channel);
  m->cluster = etcdserverpb::Cluster::NewStub(m->channel);
  return m;
}

void EtcdClient::Impl::fail(const std::string& what, const grpc::Status& status,
                            std::chrono::milliseconds waited) const {
  std::ostringstream os;
  os << "etcd (" << channels_now()->names << "): " << what << ": ";
  const auto code = status.error_code();
  const std::string detail = "gRPC " + std::to_string(int(code)) + " " + status.error_message();
  if (out_of_reach(status)) {
    os << "no quorum or no member answered within " << waited.count() << " ms (" << detail << ")";
    throw EtcdUnavailable(os.str(), int(code));
  }
  os << "refused (" << detail << ")";
  throw EtcdError(os.str(), int(code));
}

EtcdClient::EtcdClient(const std::vector<std::string>& endpoints, std::chrono::milliseconds timeout,
                       const JobKey& key)
    : timeout_(timeout), impl_(std::make_unique<Impl>()) {
  if (endpoints.empty()) throw InputError("etcd: no endpoints");
  KEEL_CHECK(timeout.count() > 0, "etcd: a call's timeout must be positive");
  auto first = std::make_shared<EtcdChannels>();
  std::vector<std::pair<std::string, bool>> targets;
  for (const auto& e : endpoints) {
    bool tls = false;
    targets.emplace_back(host_port(e, &tls), tls);
    first->endpoints.push_back(tls ? kEtcdTlsScheme + targets.back().first : targets.back().first);
    first->names += (first->names.empty() ? "" : ",") + targets.back().first;
  }
  // A third of the deadline, so that a call lost with a dead Raft leader or a cut-off member
  // is tried again on the next (Impl::call); not under 500 ms, which a write under load may
  // take.
  impl_->attempt = std::max(timeout / 3, std::min(timeout, std::chrono::milliseconds(500)));
  grpc::ChannelArguments& args = impl_->args;
  // Reconnect within 100 ms to 1 s (gRPC's default starts at 1 s and grows to 2 min, far
  // too slow to come back to a member that restarted).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A member that stops answering without closing its connection (a frozen machine) is
  // noticed by pings while a watch is open. Not more often than every 5 s: that is etcd's
  // default --grpc-keepalive-min-time, below which a member drops the connection.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  // Each client its own connections, like separate processes, not shared with other clients
  // of this process through gRPC's global pool.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(-1);  // a prefix read may be large; etcd limits requests
  // A member keel started takes TLS with a client certificate of the job's CA, issued here.
  const bool own =
      std::all_of(targets.begin(), targets.end(), [](const auto& t) { return t.second; });
  if (std::any_of(targets.begin(), targets.end(), [](const auto& t) { return t.second; })) {
    const EtcdTlsCerts certs = issue_etcd_certs("", key);
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = certs.ca_pem;
    o.pem_private_key = certs.key_pem;
    o.pem_cert_chain = certs.cert_pem;
    impl_->tls = grpc::SslCredentials(o);
  }
  for (const auto& [e, with_tls] : targets) first->list.push_back(impl_->open(e, with_tls));
  impl_->channels.store(std::move(first));
  impl_->on_pass_over = [this] { look_at_members(); };
  // The members of a cluster keel started are replaced as machines are lost (EtcdUpkeep), on
  // new addresses: followed here, so that a client outlives every member it was given. A
  // user's cluster is left as given (its advertised addresses may not be the ones that reach
  // it from here).
  if (own) follower_ = std::thread([this] { follow_members(); });
}

void EtcdClient::follow_members() {
  set_process_name("keel-etcd-members");  // this thread's name
  std::unique_lock<std::mutex> lock(follow_mu_);
  for (;;) {
    // A look every kFollowMembersEvery, and at once when a call found a member out of reach
    // (the one that died may have been replaced): a job's processes hold hundreds of clients,
    // and a look each from every one every second or two kept etcd's members too busy to
    // answer on a loaded machine.
    follow_cv_.wait_for(lock, kFollowMembersEvery, [this] { return stopping_ || look_now_; });
    if (stopping_) return;
    look_now_ = false;
    lock.unlock();
    try {
      adopt_members(member_list_within(std::chrono::steady_clock::now() +
                                       std::min(impl_->attempt, kFollowCallAtMost)));
    } catch (const std::exception& e) {
      // No member answered: the set stays, and the next look comes after the next failure or
      // period.
      VLOG(1) << "etcd members not followed: " << e.what();
    }
    lock.lock();
    if (follow_cv_.wait_for(lock, kFollowAtMostEvery, [this] { return stopping_; })) return;
  }
}

void EtcdClient::adopt_members(const std::vector<EtcdMemberInfo>& members) {
  const std::shared_ptr<const EtcdChannels> was = impl_->channels_now();
  auto next = std::make_shared<EtcdChannels>();
  for (const EtcdMemberInfo& m : members) {
    if (m.name.empty()) continue;  // added, not started: nothing listens there yet
    for (const std::string& url : m.client_urls) {
      bool tls = false;
      std::string hp;
      try {
        hp = host_port(url, &tls);
      } catch (const InputError&) {
        continue;
      }
      const auto same = std::find_if(was->list.begin(), was->list.end(),
                                     [&](const auto& c) { return c->name == hp; });
      next->list.push_back(same != was->list.end() ? *same : impl_->open(hp, tls));
      next->endpoints.push_back(tls ? kEtcdTlsScheme + hp : hp);
      next->names += (next->names.empty() ? "" : ",") + hp;
    }
  }
  // The same members in another order (etcd lists them by id) change nothing: a client keeps
  // the member it calls.
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  if (next->list.empty() || sorted(next->endpoints) == sorted(was->endpoints)) return;
  LOG(INFO) << "etcd members now " << next->names << " (were " << was->names << ")";
  impl_->channels.store(std::move(next));
}

void EtcdClient::look_at_members() {
  {
    std::lock_guard<std::mutex> lock(follow_mu_);
    look_now_ = true;
  }
  follow_cv_.notify_all();
}

std::vector<std::string> EtcdClient::endpoints() const {
  return impl_->channels_now()->endpoints;
}

EtcdClient::~EtcdClient() {
  if (!follower_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(follow_mu_);
    stopping_ = true;
  }
  follow_cv_.notify_all();
  follower_.join();
}

std::optional<EtcdKeyValue> EtcdClient::get(const std::string& key) {
  return get(key, steady_clock::now() + timeout_);
}

std::optional<EtcdKeyValue> EtcdClient::get(const std::string& key,
                                            std::chrono::steady_clock::time_point deadline,
                                            EtcdRead read) {
  KEEL_CHECK(!key.empty(), "etcd get: empty key");
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  req.set_serializable(read == EtcdRead::kLocal);
  etcdserverpb::RangeResponse resp;
  impl_->call("get " + key, deadline, [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
    return m.kv->Range(&c, req, &resp);
  });
  if (resp.kvs_size() == 0) return std::nullopt;
  return from_proto(resp.kvs(0));
}

std::vector<EtcdKeyValue> EtcdClient::get_prefix(const std::string& prefix,
                                                 const EtcdRange& range) {
  etcdserverpb::RangeRequest req;
  req.set_key(prefix.empty() ? std::string(1, '\0') : prefix);
  req.set_range_end(etcd_prefix_end(prefix));
  req.set_limit(range.limit);
  req.set_max_create_revision(range.max_create_revision);
  if (range.order != EtcdRange::Order::kKey) {
    req.set_sort_target(etcdserverpb::RangeRequest::CREATE);
    req.set_sort_order(range.order == EtcdRange::Order::kCreateAscending
                           ? etcdserverpb::RangeRequest::ASCEND
                           : etcdserverpb::RangeRequest::DESCEND);
  }
  etcdserverpb::RangeResponse resp;
  impl_->call(
      "get prefix " + prefix, steady_clock::now() + timeout_,
      [&](grpc::ClientContext& c, EtcdMemberChannel& m) { return m.kv->Range(&c, req, &resp); });
  std::vector<EtcdKeyValue> out;
  out.reserve(resp.kvs_size());
  for (const auto& kv : resp.kvs()) out.push_back(from_proto(kv));
  return out;
}

int64_t EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  KEEL_CHECK(!key.empty(), "etcd put: empty key");
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  impl_->call(
      "put " + key, steady_clock::now() + timeout_,
      [&](grpc::ClientContext& c, EtcdMemberChannel& m) { return m.kv->Put(&c, req, &resp); });
  writes_ += 1;
  bytes_written_ += key.size() + value.size();
  return resp.header().revision();
}

int64_t EtcdClient::create(const std::string& key, const std::string& value, int64_t lease) {
  KEEL_CHECK(!key.empty(), "etcd create: empty key");
  etcdserverpb::TxnRequest txn;
  add_guard(txn, EtcdGuard{key, 0});
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  etcdserverpb::TxnResponse resp;
  impl_->call(
      "create " + key, steady_clock::now() + timeout_,
      [&](grpc::ClientContext& c, EtcdMemberChannel& m) { return m.kv->Txn(&c, txn, &resp); });
  writes_ += 1;
  bytes_written_ += key.size() + value.size();
  // The revision of a transaction that put a new key is the key's create revision.
  return resp.succeeded() ? resp.header().revision() : 0;
}

int64_t EtcdClient::erase(const std::string& key) {
  KEEL_CHECK(!key.empty(), "etcd erase: empty key");
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(key);
  etcdserverpb::DeleteRangeResponse resp;
  impl_->call("delete " + key, steady_clock::now() + timeout_,
              [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
                return m.kv->DeleteRange(&c, req, &resp);
              });
  writes_ += 1;
  bytes_written_ += key.size();
  return resp.deleted();
}

int64_t EtcdClient::erase_prefix(const std::string& prefix) {
  KEEL_CHECK(!prefix.empty(), "etcd erase_prefix: an empty prefix would delete every key");
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(prefix);
  req.set_range_end(etcd_prefix_end(prefix));
  etcdserverpb::DeleteRangeResponse resp;
  impl_->call("delete prefix " + prefix, steady_clock::now() + timeout_,
              [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
                return m.kv->DeleteRange(&c, req, &resp);
              });
  writes_ += 1;
  bytes_written_ += prefix.size();
  return resp.deleted();
}

bool EtcdClient::put_if(const EtcdGuard& guard, const std::string& key, const std::string& value,
                        int64_t lease) {
  return put_all_if(guard, {{key, value}}, lease);
}

bool EtcdClient::put_all_if(const EtcdGuard& guard,
                            const std::vector<std::pair<std::string, std::string>>& kvs,
                            int64_t lease) {
  KEEL_CHECK(!kvs.empty() && kvs.size() <= kMaxTxnOps, "etcd put_all_if: ", kvs.size(),
             " keys (1 to ", kMaxTxnOps, ")");
  etcdserverpb::TxnRequest txn;
  add_guard(txn, guard);
  size_t bytes = 0;
  for (const auto& [key, value] : kvs) {
    KEEL_CHECK(!key.empty(), "etcd put_if: empty key");
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
    put->set_lease(lease);
    bytes += key.size() + value.size();
  }
  const std::string what =
      kvs.size() == 1 ? "put " + kvs.front().first
                      : detail::concat("put ", kvs.size(), " keys from ", kvs.front().first);
  etcdserverpb::TxnResponse resp;
  impl_->call(what + " if " + guard.key + " @" + std::to_string(guard.create_revision),
              steady_clock::now() + timeout_, [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
                return m.kv->Txn(&c, txn, &resp);
              });
  writes_ += 1;
  bytes_written_ += bytes;
  return resp.succeeded();
}

void EtcdClient::put_all(const std::vector<std::pair<std::string, std::string>>& kvs) {
  for (size_t first = 0; first < kvs.size(); first += kMaxTxnOps) {
    etcdserverpb::TxnRequest txn;
    size_t bytes = 0;
    for (size_t i = first; i < std::min(kvs.size(), first + kMaxTxnOps); ++i) {
      KEEL_CHECK(!kvs[i].first.empty(), "etcd put_all: empty key");
      etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(kvs[i].first);
      put->set_value(kvs[i].second);
      bytes += kvs[i].first.size() + kvs[i].second.size();
    }
    etcdserverpb::TxnResponse resp;
    impl_->call("put " + std::to_string(txn.success_size()) + " keys from " + kvs[first].first,
                steady_clock::now() + timeout_, [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
                  return m.kv->Txn(&c, txn, &resp);
                });
    writes_ += 1;
    bytes_written_ += bytes;
  }
}

bool EtcdClient::erase_if(const EtcdGuard& guard, const std::string& key, bool prefix) {
  KEEL_CHECK(!key.empty(), "etcd erase_if: empty key");
  etcdserverpb::TxnRequest txn;
  add_guard(txn, guard);
  etcdserverpb::DeleteRangeRequest* del = txn.add_success()->mutable_request_delete_range();
  del->set_key(key);
  if (prefix) del->set_range_end(etcd_prefix_end(key));
  etcdserverpb::TxnResponse resp;
  impl_->call("delete " + key + " if " + guard.key + " @" + std::to_string(guard.create_revision),
              steady_clock::now() + timeout_, [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
                return m.kv->Txn(&c, txn, &resp);
              });
  writes_ += 1;
  bytes_written_ += key.size();
  return resp.succeeded();
}

bool EtcdClient::put_if_unchanged(const std::string& key, int64_t mod_revision,
                                  const std::string& value, std::optional<EtcdKeyValue>* current,
                                  const std::string& writer, const EtcdGuard* guard) {
  KEEL_CHECK(!key.empty(), "etcd put_if_unchanged: empty key");
  etcdserverpb::TxnRequest txn;
  // etcd compares an absent key as one whose revisions are all 0.
  etcdserverpb::Compare* c = txn.add_compare();
  c->set_result(etcdserverpb::Compare::EQUAL);
  c->set_target(etcdserverpb::Compare::MOD);
  c->set_key(key);
  c->set_mod_revision(mod_revision);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  // On a lost race, the winner's write comes back in the same round trip.
  txn.add_failure()->mutable_request_range()->set_key(key);
  const std::string writer_key = key + kEtcdWriterSuffix;
  if (!writer.empty()) {
    etcdserverpb::PutRequest* mark = txn.add_success()->mutable_request_put();
    mark->set_key(writer_key);
    mark->set_value(writer);
    txn.add_failure()->mutable_request_range()->set_key(writer_key);
  }
  // The guard's key comes back on failure last, to tell a lost leadership from a lost race.
  if (guard) {
    add_guard(txn, *guard);
    txn.add_failure()->mutable_request_range()->set_key(guard->key);
  }
  etcdserverpb::TxnResponse resp;
  impl_->call(
      "put " + key + " if at @" + std::to_string(mod_revision), steady_clock::now() + timeout_,
      [&](grpc::ClientContext& ctx, EtcdMemberChannel& m) { return m.kv->Txn(&ctx, txn, &resp); });
  writes_ += 1;
  bytes_written_ +=
      key.size() + value.size() + (writer.empty() ? 0 : writer_key.size() + writer.size());
  if (resp.succeeded()) return true;
  if (guard) {
    const auto& last = resp.responses(resp.responses_size() - 1).response_range();
    if (last.kvs_size() == 0 || last.kvs(0).create_revision() != guard->create_revision)
      throw LostLeadership(detail::concat("etcd refused the fenced write of ", key, ": ",
                                          guard->key, " @", guard->create_revision,
                                          " does not hold"));
  }
  std::optional<EtcdKeyValue> now;
  if (resp.responses_size() > 0 && resp.responses(0).response_range().kvs_size() > 0)
    now = from_proto(resp.responses(0).response_range().kvs(0));
  // A try before this one was applied though its answer was lost (it timed out, and call()
  // sent it again): the key holds this call's own write.
  if (!writer.empty() && now && now->value == value && resp.responses_size() > 1 &&
      resp.responses(1).response_range().kvs_size() > 0 &&
      resp.responses(1).response_range().kvs(0).value() == writer)
    return true;
  if (current) *current = now;
  return false;
}

EtcdLease EtcdClient::lease_grant(std::chrono::seconds ttl) {
  KEEL_CHECK(ttl.count() >= 1, "etcd lease: the TTL is whole seconds, at least 1");
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl.count());
  etcdserverpb::LeaseGrantResponse resp;
  const auto requested = steady_clock::now();
  impl_->call("lease grant", requested + timeout_,
              [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
                return m.lease->LeaseGrant(&c, req, &resp);
              });
  if (!resp.error().empty())
    throw EtcdError("etcd (" + impl_->channels_now()->names + "): lease grant: " + resp.error(), 0);
  return EtcdLease{resp.id(), std::chrono::seconds(resp.ttl()), requested};
}

void EtcdClient::lease_revoke(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseRevokeResponse resp;
  try {
    impl_->call("lease revoke", steady_clock::now() + timeout_,
                [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
                  return m.lease->LeaseRevoke(&c, req, &resp);
                });
  } catch (const EtcdUnavailable&) {
    throw;
  } catch (const EtcdError& e) {
    // etcd answers NOT_FOUND for a lease that expired or was revoked: the goal is reached.
    if (e.code() != int(grpc::StatusCode::NOT_FOUND)) throw;
  }
}

std::chrono::seconds EtcdClient::lease_refresh(int64_t lease,
                                               std::chrono::steady_clock::time_point deadline) {
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse resp;
  // One request on a stream of its own, so that the refresh has a deadline like any call
  // (a long-lived stream could only time out as a whole).
  impl_->call("lease refresh", deadline, [&](grpc::ClientContext& c, EtcdMemberChannel& m) {
    // Refused by a member that lost its leader, instead of waiting on it: the keeper tries
    // another member while the lease still runs.
    c.AddMetadata("hasleader", "true");
    auto stream = m.lease->LeaseKeepAlive(&c);
    const bool sent = stream->Write(req) && stream->WritesDone();
    const bool got = sent && stream->Read(&resp);
    grpc::Status status = stream->Finish();
    if (status.ok() && !got)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "lease refresh stream closed early");
    return status;
  });
  return std::chrono::seconds(resp.ttl());
}

}  // namespace keel
