// The etcd members keel-launch starts itself, one beside each of the first 3 (or 5) slots of a
// job (DESIGN.md, Processes): one EtcdMember is one `etcd` process of this machine, bound to
// the slot's address only, dying with the process that started it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "launcher/timings.h"

namespace keel {

struct EtcdMemberSpec {
  std::string name;      // unique in the cluster, e.g. "slot0"
  std::string host;      // the IPv4 address it listens on and advertises; never 0.0.0.0
  int client_port = 0;   // for keel's clients
  int peer_port = 0;     // for the other members (Raft)
  std::string data_dir;  // must not hold data yet (a stale member would rejoin its old
                         // cluster); removed by stop()
  std::string log_path;  // the member's own log (stdout and stderr)
  std::string cluster;   // every member: "name=https://host:peer_port,..." (etcd_cluster())
  std::string token;     // the job id: members of another job never join this cluster
  // A member added to a running cluster (EtcdClient::member_add) to replace a lost one, not
  // one of a new cluster: --initial-cluster-state existing.
  bool join_existing = false;
  // Raft timing for a LAN (round trips well under 1 ms): a heartbeat every 100 ms costs
  // nothing, and a 1 s election timeout (etcd's rule: at least 5 heartbeats; 10 is its
  // advice) replaces a dead Raft leader within 1-2 s yet rides out a busy machine's scheduling
  // hiccups, since a needless election stalls every write. It also sets etcd's shortest lease
  // (1.5 election timeouts, whole seconds: 2 s), the bound on a controller failover.
  int heartbeat_ms = int(timings::kEtcdHeartbeat.count());
  int election_timeout_ms = int(timings::kEtcdElectionTimeout.count());
  std::string binary = "etcd";  // looked up in PATH unless a path
  // TLS with client certificates, clients and peers alike, from the CA of the process's job
  // key (launcher/etcd/etcd_tls.h); certificates in `data_dir`.tls. Off only for tests of
  // plain etcd.
  bool tls = true;
};

// The --initial-cluster value naming every member of `members`.
std::string etcd_cluster(const std::vector<EtcdMemberSpec>& members);

// `n` distinct TCP ports free on `host` now (bound and released: another process may still
// take one before etcd does, so a member that fails to bind is started again on new ones).
std::vector<int> free_tcp_ports(const std::string& host, int n);

class EtcdMember {
 public:
  // Starts the member (does not wait for it: a new cluster is healthy only once a quorum of
  // its members runs, so start them all, then wait_healthy() on each). Throws InputError on a
  // bad spec, keel::Error if the process cannot be started.
  explicit EtcdMember(EtcdMemberSpec spec);
  ~EtcdMember();  // stop(), errors logged
  EtcdMember(const EtcdMember&) = delete;
  EtcdMember& operator=(const EtcdMember&) = delete;

  // Waits until the member answers and knows a leader (its cluster has quorum). Throws
  // EtcdUnavailable with the end of the member's log if it exits or `timeout` passes.
  void wait_healthy(std::chrono::milliseconds timeout);

  // Stops the member (SIGKILL: its data goes next, so there is nothing to stop gracefully),
  // reaps it and removes its data dir. Idempotent; also after the process was killed from outside.
  void stop();

  // Whether its process still runs (reaps it when it has ended).
  bool running();
  // Starts the member's process again after it ended (killed, crashed) from its own data
  // dir: it rejoins its cluster as the same member, with the same name, ports and
  // certificates, so the cluster is whole again without a membership change. Throws
  // keel::Error if it still runs or cannot be started.
  void restart();

  // The member's process (for tests and fault injection: kill -9, kill -STOP); -1 once stopped.
  pid_t pid() const { return pid_; }
  // "https://host:client_port" ("host:client_port" without TLS): an EtcdClient endpoint.
  std::string endpoint() const;
  // From start to healthy (wait_healthy's return); zero before.
  std::chrono::milliseconds startup_time() const { return startup_time_; }
  const EtcdMemberSpec& spec() const { return spec_; }

 private:
  void start();  // spawns the process of spec_
  std::string log_tail() const;
  // Where its certificates are (beside its data dir, removed with it).
  std::string tls_dir() const;

  EtcdMemberSpec spec_;
  pid_t pid_ = -1;
  std::chrono::steady_clock::time_point started_;
  std::chrono::milliseconds startup_time_{0};
};

}  // namespace keel
