#include "parallel/hash_store.h"

namespace keel {

void HashStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    map_[key] = value;
  }
  cv_.notify_all();
}

std::optional<std::string> HashStore::try_get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

std::optional<Store::KeyValues> HashStore::try_get_prefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  KeyValues out;
  for (auto it = map_.lower_bound(prefix); it != map_.end() && it->first.starts_with(prefix); ++it)
    out.emplace_back(it->first, it->second);
  return out;
}

std::string HashStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  std::lock_guard<std::mutex> lock(mu_);
  return map_.at(key);
}

void HashStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto missing = [&] {
    std::string m;
    for (const auto& k : keys)
      if (!map_.count(k)) m += (m.empty() ? "" : ", ") + k;
    return m;
  };
  if (!cv_.wait_for(lock, timeout, [&] { return missing().empty(); }))
    throw CommTimeout("store: timed out after " + std::to_string(timeout.count()) +
                      " ms waiting for " + missing());
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    v = (it == map_.end() ? 0 : std::stoll(it->second)) + delta;
    map_[key] = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

void HashStore::erase(const std::vector<std::string>& keys,
                      const std::vector<std::string>& prefixes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys) map_.erase(k);
  for (const auto& p : prefixes)
    for (auto it = map_.lower_bound(p); it != map_.end() && it->first.starts_with(p);)
      it = map_.erase(it);
}

}  // namespace keel
