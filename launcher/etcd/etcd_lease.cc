#include "launcher/etcd/etcd_lease.h"

#include <glog/logging.h>

#include <algorithm>

#include "launcher/processes.h"

namespace keel {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

EtcdLeaseKeeper::EtcdLeaseKeeper(EtcdClient& client, EtcdLease lease,
                                 std::function<void()> on_lapse)
    : client_(client), lease_(lease), on_lapse_(std::move(on_lapse)) {
  KEEL_CHECK(lease.id != 0 && lease.ttl.count() >= 1, "etcd lease keeper: no lease");
  expires_ = (lease.requested + lease.ttl).time_since_epoch().count();
  thread_ = std::thread([this] { run(); });
}

EtcdLeaseKeeper::~EtcdLeaseKeeper() {
  stop();
}

bool EtcdLeaseKeeper::alive() const {
  return !lapsed_.load() && steady_clock::now().time_since_epoch().count() < expires_.load();
}

void EtcdLeaseKeeper::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  // From on_lapse (the keeper's own thread) it ends after the callback returns.
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

void EtcdLeaseKeeper::run() {
  set_process_name("keel-etcd-lease");
  const auto period = std::chrono::duration_cast<milliseconds>(lease_.ttl) / 3;
  auto next = lease_.requested + period;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (wake_.wait_until(lock, next, [&] { return stopping_; })) return;
    }
    const auto expires = steady_clock::time_point(steady_clock::duration(expires_.load()));
    const auto sent = steady_clock::now();
    bool refreshed = false;
    bool gone = false;
    if (sent < expires) {
      try {
        const std::chrono::seconds ttl = client_.lease_refresh(lease_.id, expires);
        gone = ttl.count() <= 0;
        if (!gone) {
          expires_ = (sent + ttl).time_since_epoch().count();
          refreshed = true;
        }
      } catch (const EtcdError& e) {
        LOG(WARNING) << "etcd lease " << std::hex << lease_.id << std::dec
                     << " not refreshed: " << e.what();
      }
    }
    if (gone ||
        steady_clock::now() >= steady_clock::time_point(steady_clock::duration(expires_.load()))) {
      lapsed_ = true;
      LOG(WARNING) << "etcd lease " << std::hex << lease_.id << std::dec
                   << (gone ? " is gone (expired or revoked)" : " lapsed: no refresh got through");
      if (on_lapse_) on_lapse_();
      return;
    }
    next = refreshed ? sent + period : steady_clock::now() + milliseconds(100);
  }
}

}  // namespace keel
