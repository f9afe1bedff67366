// A worker's or agent's view of the job's leader controller when the job has etcd (DESIGN.md,
// Control state and failover): the leader's published endpoint and process, followed through the
// election, so that the rank's progress reports go to whichever controller leads now and a
// controller_crash fault can find the process to kill. Without etcd there is one controller
// at a fixed endpoint and no LeaderLink.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "proto/control_state.pb.h"

namespace keel {

class EtcdClient;
class LeaderObserver;

class LeaderLink {
 public:
  // Follows the leadership of job `job` on the etcd at `endpoints`; `on_change` runs (on an
  // etcd thread) with every leader that publishes itself, the current one first. Throws
  // EtcdUnavailable if etcd cannot be reached. `recheck`: also read the leadership that often
  // (LeaderObserver; 0: the watch alone).
  LeaderLink(const std::vector<std::string>& endpoints, const std::string& job,
             std::function<void(const state::Leader&)> on_change,
             std::chrono::milliseconds recheck = std::chrono::milliseconds(0));
  ~LeaderLink();
  LeaderLink(const LeaderLink&) = delete;
  LeaderLink& operator=(const LeaderLink&) = delete;

  // The leader as last seen; nullopt between two leaders.
  std::optional<state::Leader> leader() const;
  // When etcd last showed a leader (LeaderObserver::leader_seen_at): a controller that went
  // silent while etcd still shows one is failing over, not gone.
  std::chrono::steady_clock::time_point leader_seen_at() const;
  // The job's etcd as this link's client reaches it now (EtcdClient::endpoints: a cluster keel
  // started is followed as its members are replaced).
  std::vector<std::string> etcd_endpoints() const;

 private:
  mutable std::mutex mu_;
  std::optional<state::Leader> leader_;
  std::function<void(const state::Leader&)> on_change_;
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<LeaderObserver> observer_;
};

}  // namespace keel
