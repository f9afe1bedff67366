// Keeps an etcd lease alive from a thread of its own, and says when it may have lapsed. A
// controller candidate's leadership is such a lease: once it may have expired, the candidate
// must stop acting at once, even before etcd says so, because another candidate may lead.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "launcher/etcd/etcd_client.h"

namespace keel {

class EtcdLeaseKeeper {
 public:
  // Refreshes `lease` (granted with `ttl`) every ttl/3 until stop() or destruction; after a
  // failed refresh, every 100 ms while the lease may still run. The lease counts as lapsed
  // when no refresh got through before it would expire, counted from when the last good
  // refresh was sent (so never later than etcd's own expiry), or when etcd says it is gone.
  // Then on_lapse runs once, on the keeper's thread, and refreshing ends. `client` must
  // outlive the keeper.
  EtcdLeaseKeeper(EtcdClient& client, EtcdLease lease, std::function<void()> on_lapse = {});
  ~EtcdLeaseKeeper();  // stop()
  EtcdLeaseKeeper(const EtcdLeaseKeeper&) = delete;
  EtcdLeaseKeeper& operator=(const EtcdLeaseKeeper&) = delete;

  // Whether the lease surely still runs: false from the moment it may have expired, whether
  // or not the keeper's thread has noticed yet.
  bool alive() const;
  // Stops refreshing (without revoking: the lease then expires after its TTL). Idempotent;
  // may be called from on_lapse.
  void stop();

  int64_t id() const { return lease_.id; }
  std::chrono::seconds ttl() const { return lease_.ttl; }

 private:
  void run();

  EtcdClient& client_;
  const EtcdLease lease_;
  std::function<void()> on_lapse_;
  std::atomic<bool> lapsed_{false};
  std::atomic<std::chrono::steady_clock::rep> expires_;  // steady_clock ticks
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace keel
