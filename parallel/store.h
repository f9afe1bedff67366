// The rendezvous key-value store that communicators meet through. Keys are namespaced by a
// prefix that includes the job epoch ("3/tp/1/addr/0"), so a rebuild for epoch E+1 never
// meets an address published for epoch E. Implementations: TcpStore (a server any local or
// remote process can reach; tcp_store.h). The launcher will back it by the controller.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm_error.h"

namespace keel {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Sets every key = value: one call, and for a store that can (etcd) one write, for a batch
  // of records.
  virtual void set_all(const std::vector<std::pair<std::string, std::string>>& kvs) {
    for (const auto& [k, v] : kvs) set(k, v);
  }
  // Waits until key exists and returns its value; throws CommTimeout after `timeout`.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // The value of `key` if it exists now, without waiting: "is it there" is one round trip,
  // not a get with a tiny timeout that a loaded store can miss.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // Waits until all keys exist; throws CommTimeout naming the missing ones after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Atomically adds delta to the integer at key (0 if absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Removes `keys` and every key that starts with one of `prefixes` (absent ones are no
  // error). Housekeeping: the keys of an epoch every rank has left are never read again, and
  // a job that recovers thousands of times must not keep them all in its controller.
  virtual void erase(const std::vector<std::string>& keys,
                     const std::vector<std::string>& prefixes) = 0;
  // Every key that starts with `prefix`, with its value, in key order, in one read: nullopt
  // where the store cannot list its keys (TcpStore), and the caller reads those it expects
  // one by one. The controller's read of an epoch's acks: one call at any world size.
  using KeyValues = std::vector<std::pair<std::string, std::string>>;
  virtual std::optional<KeyValues> try_get_prefix(const std::string& prefix) {
    (void)prefix;
    return std::nullopt;
  }
};

// Prepends a prefix to every key of another store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
      : prefix_(std::move(prefix)), inner_(std::move(inner)) {}
  void set(const std::string& key, const std::string& value) override {
    inner_->set(prefix_ + key, value);
  }
  void set_all(const std::vector<std::pair<std::string, std::string>>& kvs) override {
    std::vector<std::pair<std::string, std::string>> full;
    for (const auto& [k, v] : kvs) full.emplace_back(prefix_ + k, v);
    inner_->set_all(full);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->get(prefix_ + key, timeout);
  }
  std::optional<std::string> try_get(const std::string& key) override {
    return inner_->try_get(prefix_ + key);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    inner_->wait(full, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return inner_->add(prefix_ + key, delta);
  }
  void erase(const std::vector<std::string>& keys,
             const std::vector<std::string>& prefixes) override {
    std::vector<std::string> k, p;
    for (const auto& x : keys) k.push_back(prefix_ + x);
    for (const auto& x : prefixes) p.push_back(prefix_ + x);
    inner_->erase(k, p);
  }
  std::optional<KeyValues> try_get_prefix(const std::string& prefix) override {
    std::optional<KeyValues> all = inner_->try_get_prefix(prefix_ + prefix);
    if (all)
      for (auto& [k, v] : *all) k.erase(0, prefix_.size());
    return all;
  }

 private:
  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

// Typed values (proto/store_values.proto; keys in proto/store_keys.h): every value in the
// store is a serialised protobuf message. `M` is any message type. A value that does not
// parse as an `M` throws keel::Error naming the key: a store is the job's own, so a bad value
// is a bug or a stranger, never input to guess at.
template <class M>
void set_message(Store& store, const std::string& key, const M& value) {
  store.set(key, value.SerializeAsString());
}
template <class M>
M parse_message(const std::string& key, const std::string& bytes) {
  M m;
  if (!m.ParseFromString(bytes))
    throw Error("store key '" + key + "' does not hold a " +
                std::string(M::descriptor()->full_name()));
  return m;
}
template <class M>
M get_message(Store& store, const std::string& key, std::chrono::milliseconds timeout) {
  return parse_message<M>(key, store.get(key, timeout));
}
template <class M>
std::optional<M> try_get_message(Store& store, const std::string& key) {
  std::optional<std::string> v = store.try_get(key);
  if (!v) return std::nullopt;
  return parse_message<M>(key, *v);
}

}  // namespace keel
