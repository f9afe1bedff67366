#include "launcher/etcd/leader_election.h"

#include <glog/logging.h>

#include <cstdio>

#include "launcher/processes.h"

namespace keel {

using std::chrono::steady_clock;

std::optional<LeaderInfo> find_leader(EtcdClient& client, const std::string& prefix) {
  EtcdRange first;
  first.order = EtcdRange::Order::kCreateAscending;
  first.limit = 1;
  const std::vector<EtcdKeyValue> kvs = client.get_prefix(prefix, first);
  if (kvs.empty()) return std::nullopt;
  return LeaderInfo{kvs[0].value, kvs[0].key, kvs[0].create_revision};
}

LeaderObserver::LeaderObserver(EtcdClient& client, std::string prefix, Callback callback,
                               std::chrono::milliseconds recheck)
    : client_(client), prefix_(std::move(prefix)), callback_(std::move(callback)) {
  KEEL_CHECK(bool(callback_), "LeaderObserver: no callback");
  // The watch first, then the first read: a change between the two is seen twice at worst,
  // never missed.
  watch_ = std::make_unique<EtcdWatch>(client_, prefix_, true,
                                       [this](const std::vector<EtcdEvent>&) { update(); });
  update();
  if (recheck.count() <= 0) return;
  recheck_ = std::thread([this, recheck] {
    set_process_name("keel-etcd-leader");
    std::unique_lock<std::mutex> lock(stop_mu_);
    while (!stop_cv_.wait_for(lock, recheck, [this] { return stopping_; })) {
      lock.unlock();
      update();
      lock.lock();
    }
  });
}

LeaderObserver::~LeaderObserver() {
  {
    std::lock_guard<std::mutex> g(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (recheck_.joinable()) recheck_.join();
  watch_->cancel();
}

void LeaderObserver::update() {
  // Reads the leader again rather than working it out from the events: the first key by
  // create revision is what every candidate goes by. Under the lock, read and report
  // together, so that a slower read of an older state is never reported after a newer one.
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<LeaderInfo> now;
  try {
    now = find_leader(client_, prefix_);
  } catch (const EtcdUnavailable& e) {
    // Read again at the next change under the prefix, or the next recheck.
    LOG_EVERY_N(WARNING, 20) << "leader observer " << prefix_ << ": " << e.what();
    return;
  }
  if (now) leader_seen_at_ = std::chrono::steady_clock::now().time_since_epoch().count();
  const bool same =
      reported_ && now.has_value() == last_.has_value() &&
      (!now || (now->key == last_->key && now->term == last_->term && now->value == last_->value));
  if (same) return;
  last_ = now;
  reported_ = true;
  callback_(now);
}

LeaderElection::LeaderElection(EtcdClient& client, std::string prefix, std::chrono::seconds ttl,
                               std::function<void()> on_lost)
    : client_(client), prefix_(std::move(prefix)), ttl_(ttl), on_lost_(std::move(on_lost)) {
  KEEL_CHECK(!prefix_.empty(), "LeaderElection: empty prefix");
  KEEL_CHECK(ttl_.count() >= 1, "LeaderElection: the lease TTL is whole seconds, at least 1");
}

LeaderElection::~LeaderElection() {
  try {
    resign();
  } catch (const Error& e) {
    // The lease expires by itself after its TTL: the next candidate leads then.
    LOG(WARNING) << "leader election " << key_ << ": resign failed: " << e.what();
  }
}

bool LeaderElection::campaign(const std::string& value, std::chrono::milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  if (over_) throw LostLeadership("leader election " + prefix_ + ": this candidacy is over");
  if (!keeper_) {
    const EtcdLease lease = client_.lease_grant(ttl_);
    char hex[32];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(lease.id));
    key_ = prefix_ + hex;
    keeper_ = std::make_unique<EtcdLeaseKeeper>(client_, lease, [this] { lose("lease lapsed"); });
    // Deletions under the prefix wake the wait below; the deletion of this candidate's own
    // key (its lease revoked from outside) ends the candidacy at once.
    watch_ = std::make_unique<EtcdWatch>(client_, prefix_, true,
                                         [this](const std::vector<EtcdEvent>& e) { on_events(e); });
  }
  if (term_ == 0) {
    term_ = client_.create(key_, value, keeper_->id());
    // The key is new (its name is this candidacy's own lease) unless a retried create had
    // written it already: then read its term.
    if (term_ == 0) {
      const std::optional<EtcdKeyValue> mine = client_.get(key_);
      if (!mine) {
        lose("candidacy key gone");
        throw LostLeadership("leader election " + key_ + ": candidacy key gone");
      }
      term_ = mine->create_revision;
    }
    value_ = value;
  } else if (value != value_) {
    if (!client_.put_if(guard(), key_, value, keeper_->id())) {
      lose("candidacy key gone");
      throw LostLeadership("leader election " + key_ + ": candidacy key gone");
    }
    value_ = value;
  }
  for (;;) {
    if (over_ || !keeper_->alive())
      throw LostLeadership("leader election " + key_ + ": lease lapsed while campaigning");
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen = deletions_;
    }
    // The candidate just ahead of this one: the last key created before it.
    EtcdRange ahead;
    ahead.order = EtcdRange::Order::kCreateDescending;
    ahead.limit = 1;
    ahead.max_create_revision = term_ - 1;
    if (client_.get_prefix(prefix_, ahead).empty()) {
      leading_ = true;
      // The key, not the value: a value is the caller's bytes (a serialized message).
      LOG(INFO) << "leader election " << prefix_ << ": " << key_ << " leads (term " << term_ << ")";
      return is_leader();
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (!deleted_.wait_until(lock, deadline, [&] { return deletions_ != seen || over_; }))
      return false;
  }
}

bool LeaderElection::is_leader() const {
  return leading_.load() && !over_.load() && keeper_ && keeper_->alive();
}

void LeaderElection::fenced_put(const std::string& key, const std::string& value) {
  fenced_put_all({{key, value}});
}

void LeaderElection::fenced_put_all(const std::vector<std::pair<std::string, std::string>>& kvs) {
  const std::string what = kvs.size() == 1
                               ? "fenced put " + kvs.front().first
                               : detail::concat("fenced put of ", kvs.size(), " keys from ",
                                                kvs.empty() ? std::string() : kvs.front().first);
  if (!is_leader()) throw LostLeadership(what + ": " + key_ + " does not lead");
  if (!client_.put_all_if(guard(), kvs)) {
    lose("a fenced write was refused");
    throw LostLeadership(what + ": refused, " + key_ + " leads no more");
  }
}

void LeaderElection::fenced_delete(const std::string& key, bool prefix) {
  if (!is_leader()) throw LostLeadership("fenced delete " + key + ": " + key_ + " does not lead");
  if (!client_.erase_if(guard(), key, prefix)) {
    lose("a fenced write was refused");
    throw LostLeadership("fenced delete " + key + ": refused, " + key_ + " leads no more");
  }
}

std::optional<LeaderInfo> LeaderElection::leader() {
  return find_leader(client_, prefix_);
}

std::unique_ptr<LeaderObserver> LeaderElection::observe(LeaderObserver::Callback callback) {
  return std::make_unique<LeaderObserver>(client_, prefix_, std::move(callback));
}

EtcdGuard LeaderElection::guard() const {
  return EtcdGuard{key_, term_};
}

void LeaderElection::resign() {
  const bool had_lease = keeper_ != nullptr && !over_;
  lost_reported_ = true;  // stepping down is no loss to report
  over_ = true;
  leading_ = false;
  stop_threads();
  // Revoking the lease deletes the key with it: the next candidate's watch sees that now,
  // not a TTL later.
  if (had_lease) client_.lease_revoke(keeper_->id());
}

void LeaderElection::abandon() {
  lost_reported_ = true;
  over_ = true;
  leading_ = false;
  stop_threads();
}

void LeaderElection::stop_threads() {
  deleted_.notify_all();
  if (watch_) watch_->cancel();
  if (keeper_) keeper_->stop();
}

void LeaderElection::lose(const char* why) {
  const bool was_leading = leading_.exchange(false);
  over_ = true;
  {
    // Between campaign()'s test of over_ and its wait: the wake-up below is not missed.
    std::lock_guard<std::mutex> lock(mu_);
  }
  deleted_.notify_all();
  if (lost_reported_.exchange(true)) return;
  LOG(WARNING) << "leader election " << key_ << ": " << (was_leading ? "leadership" : "candidacy")
               << " lost: " << why;
  if (on_lost_) on_lost_();
}

void LeaderElection::on_events(const std::vector<EtcdEvent>& events) {
  bool any = false;
  bool mine = false;
  for (const EtcdEvent& e : events) {
    if (e.type != EtcdEvent::Type::kDelete) continue;
    any = true;
    mine = mine || e.kv.key == key_;
  }
  if (!any) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++deletions_;
  }
  deleted_.notify_all();
  if (mine) lose("its key was deleted (lease revoked or expired)");
}

}  // namespace keel
