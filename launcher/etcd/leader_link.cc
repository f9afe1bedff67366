#include "launcher/etcd/leader_link.h"

#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/leader_election.h"
#include "proto/store_keys.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// Its calls only read the leadership, off the step path; short, so that a process that ends
// while a member is gone (its watch in a call) is not held up by it.
constexpr std::chrono::milliseconds kCallTimeout{1000};

}  // namespace

LeaderLink::LeaderLink(const std::vector<std::string>& endpoints, const std::string& job,
                       std::function<void(const state::Leader&)> on_change,
                       std::chrono::milliseconds recheck)
    : on_change_(std::move(on_change)),
      client_(std::make_unique<EtcdClient>(endpoints, kCallTimeout)) {
  observer_ = std::make_unique<LeaderObserver>(
      *client_, keys::state::leader_prefix(job),
      [this](const std::optional<LeaderInfo>& info) {
        std::optional<state::Leader> now;
        if (info) {
          state::Leader l;
          if (l.ParseFromString(info->value)) {
            l.set_term(info->term);  // etcd's, not the candidate's word
            now = l;
          } else
            LOG(WARNING) << "the leader key " << info->key << " holds no state::Leader";
        }
        {
          std::lock_guard<std::mutex> g(mu_);
          leader_ = now;
        }
        if (now && on_change_) on_change_(*now);
      },
      recheck);
}

LeaderLink::~LeaderLink() {
  observer_.reset();  // its thread ends before the client goes
}

std::chrono::steady_clock::time_point LeaderLink::leader_seen_at() const {
  return observer_->leader_seen_at();
}

std::optional<state::Leader> LeaderLink::leader() const {
  std::lock_guard<std::mutex> g(mu_);
  return leader_;
}

std::vector<std::string> LeaderLink::etcd_endpoints() const {
  return client_->endpoints();
}

}  // namespace keel
