// Leader election among controller candidates, with fencing (DESIGN.md, Control state and
// failover). The recipe of etcd's own clientv3/concurrency Election, on keys, leases and
// transactions: each candidate writes a key <prefix><lease id> attached to its lease; the
// candidate whose key has the lowest create revision leads; the others wait for the key just
// ahead of theirs to go. That create revision is the leader's term (it grows with every new
// leader) and its fencing token: every write a leader makes is a transaction conditional on
// its key still existing with that revision, so a leader whose lease lapsed (a crash, a
// partition, a pause) cannot write once another may lead.
//
// Why not etcd's v3election service (Campaign/Leader/Observe): its Campaign is one call that
// blocks on the server for as long as the election takes, and when it is cut short (a
// deadline, a dead member) the server deletes the candidacy; here every call has a deadline,
// a candidate keeps its place across calls and member failures, and the watches that find
// the leader are the same as every other watch of keel.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/etcd_lease.h"
#include "launcher/etcd/etcd_watch.h"

namespace keel {

// The leader as everyone sees it.
struct LeaderInfo {
  std::string value;  // what the leader published: its control-plane endpoint
  std::string key;    // its candidacy key
  int64_t term = 0;   // its key's create revision: larger for every later leader
};

// The current leader under `prefix`, or nullopt if there is none.
std::optional<LeaderInfo> find_leader(EtcdClient& client, const std::string& prefix);

// Calls back on every change of leader under `prefix`: first, from the constructor, with the
// leader at that time, then with each new one (nullopt: none for now) from a thread of its
// own, one call at a time. What agents and workers use to find the leader. `client` must
// outlive it. Throws EtcdUnavailable if the watch cannot be placed.
//
// With `recheck` (0: none) it also reads the leadership again that often: a watch served by a
// member that a partition cut off stays silent until gRPC's keepalive gives up (7 s), and an
// agent that learned of its new leader that late was taken for a lost slot. Agents ask for it,
// workers do not (a read per rank every half second is 32,000 a second at 16,384 ranks).
class LeaderObserver {
 public:
  using Callback = std::function<void(const std::optional<LeaderInfo>&)>;
  LeaderObserver(EtcdClient& client, std::string prefix, Callback callback,
                 std::chrono::milliseconds recheck = std::chrono::milliseconds(0));
  ~LeaderObserver();

  // When a read last found a leader under the prefix (etcd answered, and a leader's key
  // lives: the leader, or a dead one's key living out its lease); the epoch of the clock if
  // never.
  std::chrono::steady_clock::time_point leader_seen_at() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(leader_seen_at_.load()));
  }

 private:
  void update();

  EtcdClient& client_;
  const std::string prefix_;
  const Callback callback_;
  std::mutex mu_;
  std::optional<LeaderInfo> last_;
  bool reported_ = false;
  std::atomic<std::chrono::steady_clock::rep> leader_seen_at_{0};
  std::unique_ptr<EtcdWatch> watch_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread recheck_;
};

// One candidacy: one lease, one key. Once it has lost its lease (or resigned, or was
// abandoned) it is over: is_leader() stays false; campaign again with a new LeaderElection.
class LeaderElection {
 public:
  // A candidate under `prefix` (e.g. "/keel/<job>/leader/") whose leadership is a lease of
  // `ttl` (whole seconds; etcd raises it to at least 1.5 x its election timeout, rounded up:
  // 2 s for keel's members). on_lost, if given, runs once when a leadership or candidacy this
  // object held ends other than by resign()/abandon(), on a keel-etcd thread. Nothing is
  // written before campaign().
  LeaderElection(EtcdClient& client, std::string prefix, std::chrono::seconds ttl,
                 std::function<void()> on_lost = {});
  ~LeaderElection();  // resign(), errors logged
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Stands with `value` (this candidate's control-plane endpoint) and waits up to `timeout`
  // to lead. Returns whether it leads; if not yet, it keeps its place in line: call again to
  // wait on. Throws LostLeadership if the candidacy is over, EtcdUnavailable if etcd did not
  // answer in time (the candidacy may stand: call again).
  bool campaign(const std::string& value, std::chrono::milliseconds timeout);

  // Whether this candidate leads: false at once when its lease may have lapsed, when its key
  // was deleted, or when a fenced write was refused.
  bool is_leader() const;

  // key = value (or the key, or every key under it, deleted), only while this candidate
  // leads: one transaction guarded by the leader key's create revision. Throws
  // LostLeadership, having written nothing, when it does not lead (is_leader() false) or
  // etcd refuses the guard; EtcdUnavailable as any write.
  void fenced_put(const std::string& key, const std::string& value);
  void fenced_put_all(const std::vector<std::pair<std::string, std::string>>& kvs);
  void fenced_delete(const std::string& key, bool prefix = false);

  // A write fenced on this candidacy's guard elsewhere (a store fenced on it, etcd_store.h)
  // was refused: the candidacy is over, as when its own fenced write is.
  void refused() { lose("a fenced write was refused"); }

  // The current leader, this candidate or another (find_leader on this prefix).
  std::optional<LeaderInfo> leader();
  // A LeaderObserver on this election.
  std::unique_ptr<LeaderObserver> observe(LeaderObserver::Callback callback);

  // Steps down: deletes the key and revokes the lease, so the next candidate leads at once.
  // Idempotent.
  void resign();
  // Stops acting at once and leaves the key to expire with the lease, as a process that died
  // would: for fault injection (a controller crash) and tests.
  void abandon();

  // The guard of this candidate's writes: {its key, its term}. Empty before campaign().
  EtcdGuard guard() const;

 private:
  void lose(const char* why);
  void on_events(const std::vector<EtcdEvent>& events);
  void stop_threads();

  EtcdClient& client_;
  const std::string prefix_;
  const std::chrono::seconds ttl_;
  const std::function<void()> on_lost_;
  std::string key_;
  std::string value_;
  int64_t term_ = 0;
  std::atomic<bool> leading_{false};
  std::atomic<bool> over_{false};
  std::atomic<bool> lost_reported_{false};
  std::mutex mu_;
  std::condition_variable deleted_;
  uint64_t deletions_ = 0;  // deletions seen under the prefix, to wake campaign()
  std::unique_ptr<EtcdLeaseKeeper> keeper_;
  std::unique_ptr<EtcdWatch> watch_;
};

}  // namespace keel
