// The job's rendezvous store (parallel/store.h) kept in the job's etcd cluster, so that it
// outlives the process of the controller that used to serve it (TcpStore). Every Store key K
// is the etcd key prefix + K and holds the same bytes; add() keeps decimal text, get() and
// wait() return as soon as their keys exist, as with TcpStore. A lost quorum is a CommError
// (a CommTimeout from get and wait) within the call's timeout, never a hang or an abort.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/etcd/etcd_client.h"
#include "parallel/store.h"

namespace keel {

class EtcdStore : public Store {
 public:
  // endpoints: the members, "host:port" (IPv4); prefix: where the keys live, e.g.
  // "/keel/<job>/store/" (not empty). Sends nothing yet: the first call that finds etcd
  // unavailable throws. Throws InputError on a malformed endpoint or an empty prefix.
  // call_timeout bounds each etcd call, so set, try_get, add and erase. 5 s by default: a Raft
  // leader lost with its member is replaced within 1-2 s (etcd_members.h), which a write then
  // in flight must ride out, while a lost quorum must reach the caller as a CommError within
  // seconds rather than stall the job's rendezvous for TcpStore's 30 s.
  // `reads`: how try_get and add(key, 0) read; EtcdRead::kLocal for a rank's step path,
  // which must go on while etcd has no quorum (a runtime fault is seen a poll later at worst).
  EtcdStore(const std::vector<std::string>& endpoints, std::string prefix,
            std::chrono::milliseconds call_timeout = std::chrono::seconds(5),
            EtcdRead reads = EtcdRead::kLinearizable);
  ~EtcdStore() override;  // ends the watch, if a get opened one
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  // One put.
  void set(const std::string& key, const std::string& value) override;
  // One transaction (a batch of records, one etcd write).
  void set_all(const std::vector<std::pair<std::string, std::string>>& kvs) override;
  // A read first; a key not there yet is waited for on one prefix watch per store, opened by
  // the first get or wait that has to wait and kept until destruction (it then receives every
  // write under the prefix). Rides out an etcd outage shorter than `timeout`; after it, throws
  // CommTimeout naming the missing keys, and saying so when etcd was unavailable. Returns
  // within `timeout` + 250 ms (a key that exists is found even with a timeout of 0), or
  // + 1 s when etcd is lost just as the watch is opened.
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  // One read: linearizable (sees every write acknowledged before the call) unless the store
  // was made for local reads.
  std::optional<std::string> try_get(const std::string& key) override;
  // A compare-and-swap on the key's latest revision, retried until it wins. A value that is
  // not a decimal integer throws keel::Error naming the key. Differs from TcpStore in one
  // case: when the member or Raft leader serving the swap dies after applying it but before
  // answering, the retry cannot tell the swap was its own and adds delta once more.
  int64_t add(const std::string& key, int64_t delta) override;
  // One delete per key and per prefix: not atomic as a whole, unlike TcpStore's.
  void erase(const std::vector<std::string>& keys,
             const std::vector<std::string>& prefixes) override;
  // One linearizable range read, whatever the number of keys.
  std::optional<KeyValues> try_get_prefix(const std::string& prefix) override;

  const std::string& prefix() const;

  // Fences every write of this store on the guard `leader` returns when asked (a leader's key
  // and term, launcher/etcd/leader_election.h): set, set_all, add and erase each become
  // transactions that write only while the guard holds in etcd, and throw LostLeadership,
  // having written nothing, when it does not (or when `leader` returns an empty guard: no
  // leadership to write under). The controller's store: a deposed leader's abort, rebuild and
  // incident writes fail in etcd whatever the timing, where a local check of the lease before
  // the put cannot see a pause between the two. A set_all or erase of more keys than one
  // transaction holds (EtcdClient::kMaxTxnOps) is fenced a transaction at a time. Call before
  // the store is shared with another thread.
  void fence(std::function<EtcdGuard()> leader);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A store's address in one string, for KEEL_STORE_ADDR (which otherwise holds a TcpStore's
// "host:port"): "etcd://h1:p1,h2:p2,h3:p3/keel/<job>/store/", the prefix starting at the first
// '/'. etcd_store_address throws InputError on no endpoints, an endpoint holding ',' or '/',
// or a prefix that does not start with '/'.
bool is_etcd_store_address(const std::string& address);
std::string etcd_store_address(const std::vector<std::string>& endpoints,
                               const std::string& prefix);
// `address` with its endpoints replaced by `endpoints` (its prefix kept); any other address
// (a TcpStore's) as it is.
std::string with_etcd_endpoints(const std::string& address,
                                const std::vector<std::string>& endpoints);
// An EtcdStore (default call timeout) at `address`. Throws InputError naming the address when
// it is malformed. Sends nothing yet, like the constructor.
// `call_timeout`: each call's deadline (EtcdStore's); a rank's step-path calls take a short
// one, so that etcd without quorum costs a step that much and never stalls it.
// The deadline of a call that must not hold up its caller (a rank's step path, the
// controller's polls): a healthy etcd write takes 1-3 ms (bench/RESULTS.md), a loaded
// machine's tens; past this the call is skipped until the caller's next look.
inline constexpr std::chrono::milliseconds kEtcdQuickCall{300};
// `reads`: as EtcdStore's.
std::shared_ptr<Store> connect_etcd_store(
    const std::string& address, std::chrono::milliseconds call_timeout = std::chrono::seconds(5),
    EtcdRead reads = EtcdRead::kLinearizable);
// The same, every write fenced on `leader` (EtcdStore::fence): the leader controller's view
// of the ranks' store.
std::shared_ptr<Store> connect_fenced_etcd_store(
    const std::string& address, std::function<EtcdGuard()> leader,
    std::chrono::milliseconds call_timeout = std::chrono::seconds(5));

}  // namespace keel
