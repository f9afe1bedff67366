// A client of the job's etcd cluster (DESIGN.md, Control state and failover), over etcd's
// gRPC API: keys and values, the guarded writes that fence a controller, leases. Watches and
// lease refreshing are in etcd_watch.h and etcd_lease.h, on top of this client.
//
// One gRPC channel over every member ("ipv4:h1:p1,h2:p2,..."), so that a dead member is passed
// over. Every call has a deadline (the client's timeout): within it a call is tried again
// when the member it reached has no leader, its connection broke, or one try took a third of
// the deadline (a write lost with a Raft leader that died); at the deadline it throws
// EtcdUnavailable, so a lost quorum pauses the caller and never hangs it. A retried write may
// have been applied already: keel writes whole values (a retry writes the same bytes again).
// Values are bytes: callers store serialized protobuf messages. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "launcher/etcd/etcd_error.h"
#include "parallel/job_key.h"

namespace keel {

// One key as etcd stores it. Revisions are etcd's global write counter: create_revision is
// the write that created the key (0: it does not exist), mod_revision the latest one.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;  // the lease the key dies with (0: none)
};

// How get_prefix orders and cuts its answer.
struct EtcdRange {
  enum class Order { kKey, kCreateAscending, kCreateDescending };
  Order order = Order::kKey;
  int64_t limit = 0;                // at most this many keys (0: all)
  int64_t max_create_revision = 0;  // only keys created at or before it (0: any)
};

// A write's condition: `key` still exists with this create revision. A controller's leader
// key is the guard of all its writes (its fencing token): once the key is gone (lease lapsed,
// resigned) or was created anew, the write is refused.
struct EtcdGuard {
  std::string key;
  int64_t create_revision = 0;  // 0: the key must not exist
};

// A granted lease: the TTL may be longer than asked (etcd raises it to its minimum, 1.5 x the
// election timeout rounded up to whole seconds).
struct EtcdLease {
  int64_t id = 0;
  std::chrono::seconds ttl{0};
  // When the grant was asked for: the lease surely runs until requested + ttl.
  std::chrono::steady_clock::time_point requested;
};

// What the member the client is connected to says about itself and its cluster.
struct EtcdStatus {
  uint64_t member_id = 0;
  uint64_t leader_id = 0;  // 0: the member knows no leader (no quorum, or an election)
  uint64_t raft_term = 0;
  uint64_t raft_index = 0;  // its committed Raft index
  int64_t db_size = 0;
  std::string version;
  std::string endpoint;  // the endpoint that answered ("host:port")
};

// A member of the cluster as etcd lists it.
struct EtcdMemberInfo {
  uint64_t id = 0;
  std::string name;  // empty for a member added but not started yet
  std::vector<std::string> peer_urls;
  std::vector<std::string> client_urls;
};

// How a read is answered: through the Raft leader (sees every acknowledged write; needs a
// quorum), or by the member asked, from its own copy.
enum class EtcdRead { kLinearizable, kLocal };

// Where put_if_unchanged keeps the token of a key's last writer: beside the key, under a name
// no key of keel's ends with.
inline constexpr const char* kEtcdWriterSuffix = "\x01writer";

// The scheme of an endpoint of a member keel started, which takes TLS only.
inline constexpr const char* kEtcdTlsScheme = "https://";

class EtcdClient {
 public:
  // endpoints: "host:port" or "http://host:port" (plain gRPC: an existing cluster), or
  // "https://host:port" (a member keel started: TLS, this client's certificate issued by the
  // CA of `key`, launcher/etcd/etcd_tls.h); IPv4 literals (the slots' addresses).
  // timeout: the deadline of every call. Throws InputError on a malformed endpoint.
  explicit EtcdClient(const std::vector<std::string>& endpoints,
                      std::chrono::milliseconds timeout = std::chrono::seconds(5),
                      const JobKey& key = process_job_key());
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The key, or nullopt if it does not exist. Linearizable: sees every write acknowledged
  // before the call.
  std::optional<EtcdKeyValue> get(const std::string& key);
  // The same within `deadline` instead of the client's timeout: for a caller whose own
  // timeout is the shorter one (a store's get must not outlast its caller's timeout).
  // EtcdRead::kLocal answers from the member's own copy (etcd's serializable read): it may
  // miss the newest writes, and it needs no quorum, so it answers while etcd has none.
  std::optional<EtcdKeyValue> get(const std::string& key,
                                  std::chrono::steady_clock::time_point deadline,
                                  EtcdRead read = EtcdRead::kLinearizable);
  // Every key that starts with `prefix`, ordered and cut as `range` says.
  std::vector<EtcdKeyValue> get_prefix(const std::string& prefix, const EtcdRange& range = {});

  // Writes key = value (attached to `lease` unless 0: the key dies with it). Returns the
  // revision of the write.
  int64_t put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Creates key = value only if the key does not exist. Returns its create revision, or 0
  // when it existed already (nothing written): the "exactly once" of a numbered entry.
  int64_t create(const std::string& key, const std::string& value, int64_t lease = 0);
  // Writes every key = value in one transaction per kMaxTxnOps (etcd's --max-txn-ops): one
  // Raft entry, one write counted, for a batch of records.
  void put_all(const std::vector<std::pair<std::string, std::string>>& kvs);
  static constexpr size_t kMaxTxnOps = 128;
  // Deletes the key, or every key under the prefix. Returns how many were deleted.
  int64_t erase(const std::string& key);
  int64_t erase_prefix(const std::string& prefix);

  // The fencing primitive: the write happens only if `guard` holds, in one transaction.
  // Returns false, having written nothing, when it does not.
  // Every key = value in one transaction (at most kMaxTxnOps), only if `guard` holds.
  // Every put carries `lease` (0: none).
  bool put_all_if(const EtcdGuard& guard,
                  const std::vector<std::pair<std::string, std::string>>& kvs, int64_t lease = 0);
  bool put_if(const EtcdGuard& guard, const std::string& key, const std::string& value,
              int64_t lease = 0);
  bool erase_if(const EtcdGuard& guard, const std::string& key, bool prefix = false);

  // Compare-and-swap, for a read-modify-write that loses no concurrent update (a counter):
  // writes key = value only if the key's latest write is still `mod_revision` (0: only if the
  // key does not exist), in one transaction. Returns true if written; otherwise false, nothing
  // written, and *current (when given) is the key as it is now (nullopt: absent), to retry from
  // without another read. Retried like every write: a try whose answer was lost but that was
  // applied makes the retry report false, *current then holding that try's own write.
  // `writer`, if not empty, makes a retried try recognise its own earlier write: it is a token
  // unique to this call, written to key + kEtcdWriterSuffix in the same transaction; a try that
  // finds the key changed and the token its own reports true. Without it, a try that timed out
  // but was applied makes a counter's add count twice.
  // `guard`, if given, must hold as well (a leader's fenced counter): when it does not, throws
  // LostLeadership, having written nothing.
  bool put_if_unchanged(const std::string& key, int64_t mod_revision, const std::string& value,
                        std::optional<EtcdKeyValue>* current = nullptr,
                        const std::string& writer = "", const EtcdGuard* guard = nullptr);

  // A new lease of `ttl` (at least 1 s; etcd may raise it, see EtcdLease).
  EtcdLease lease_grant(std::chrono::seconds ttl);
  // Ends the lease now and deletes its keys. A lease that is gone already is no error.
  void lease_revoke(int64_t lease);
  // One refresh: the TTL the lease has again, 0 s if it is gone. Used by EtcdLeaseKeeper.
  std::chrono::seconds lease_refresh(int64_t lease, std::chrono::steady_clock::time_point deadline);

  // The status of the member the channel is connected to (a health check).
  EtcdStatus status();
  // The status of every endpoint's member that answers before `deadline`, one try each (a
  // member that does not is left out): to see the whole cluster, not one member's view.
  std::vector<EtcdStatus> member_statuses(std::chrono::steady_clock::time_point deadline);
  // Hands Raft leadership from `leader` (as member_statuses saw it; the call goes to its
  // endpoint, since only the leader takes it) to member `to`: etcd's MoveLeader, which
  // catches `to` up and has it campaign at once, without an election timeout. Not retried.
  // The leader drops writes until `to` leads: aim it only at a live, caught-up member
  // (robust/raft_leader_place.h). Throws EtcdUnavailable/EtcdError like any call.
  void move_leader(const EtcdStatus& leader, uint64_t to,
                   std::chrono::steady_clock::time_point deadline);

  // The cluster's members, and changes to them (Raft reconfiguration, one at a time, each
  // needing quorum): a lost member is removed and a new one added before it starts.
  // member_add returns the members after it, the new one (not started: no name) included,
  // and sets *id to the new member's. Not retried once sent: a second add would be refused.
  std::vector<EtcdMemberInfo> member_list();
  std::vector<EtcdMemberInfo> member_add(const std::string& peer_url, uint64_t* id);
  void member_remove(uint64_t id);

  // KV writes that reached etcd (puts, deletes, transactions, whether or not their guard
  // held) and the key and value bytes they carried: to measure writes per step and per
  // recovery. Leases are not counted.
  uint64_t writes() const { return writes_.load(); }
  uint64_t bytes_written() const { return bytes_written_.load(); }

  // The members calls go to now: the endpoints given, or, for a cluster keel started (every
  // endpoint https://), its members as etcd listed them last (looked at every
  // kFollowMembersEvery, and within a second of a call finding a member out of reach): a
  // member replaced on another machine is reached on its new address, and a client outlives
  // every member it was given.
  std::vector<std::string> endpoints() const;
  // Looks at etcd's members within a second (the caller changed them: EtcdUpkeep, whose
  // client then gives the processes started next the members as they are).
  void look_at_members();
  std::chrono::milliseconds timeout() const { return timeout_; }
  static constexpr std::chrono::seconds kFollowMembersEvery{30};

 private:
  friend class EtcdWatch;  // opens Watch streams on the same channel
  struct Impl;
  std::vector<EtcdMemberInfo> member_list_within(std::chrono::steady_clock::time_point deadline);
  // The follower thread's loop, and its adoption of a member list as the channels' set.
  void follow_members();
  void adopt_members(const std::vector<EtcdMemberInfo>& members);

  std::chrono::milliseconds timeout_;
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> bytes_written_{0};
  std::thread follower_;  // follow_members, for a cluster keel started
  std::mutex follow_mu_;
  std::condition_variable follow_cv_;
  bool stopping_ = false;  // under follow_mu_: the destructor ends the follower
  bool look_now_ = false;  // under follow_mu_: a call passed a member over, or look_at_members
};

}  // namespace keel
