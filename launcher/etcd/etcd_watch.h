// A watch on one etcd key or every key under a prefix: a thread that hands each change to a
// callback, in revision order, until cancelled. Agents find a new leader this way, and a
// controller candidate learns that the candidate ahead of it is gone.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "launcher/etcd/etcd_client.h"

namespace keel {

// One change. For a deletion, kv has the key and mod_revision (the deleting write) only.
struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;
};

class EtcdWatch {
 public:
  using Callback = std::function<void(const std::vector<EtcdEvent>&)>;

  // Watches `key` (with `prefix`, every key that starts with it) for changes after
  // `after_revision` (0: after the watch is in place). Returns once etcd has the watch, so
  // that no later change is missed; throws EtcdUnavailable if that takes longer than the
  // client's timeout. `callback` runs on the watch's thread, one batch at a time. When the
  // member serving the watch dies or loses its leader, the watch moves to another member and
  // resumes after the last revision delivered: no change is lost or delivered twice. `client`
  // must outlive the watch.
  EtcdWatch(EtcdClient& client, std::string key, bool prefix, Callback callback,
            int64_t after_revision = 0);
  ~EtcdWatch();  // cancel(); not to be destroyed from its own callback
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // Ends the watch: once it returns, the callback does not run again (called from the
  // callback itself, it ends the watch after the callback returns). Idempotent.
  void cancel();

 private:
  void run();

  EtcdClient& client_;
  const std::string key_;
  const bool prefix_;
  const Callback callback_;
  int64_t next_revision_;  // the first revision not yet delivered (0: from now); run() only
  std::mutex mu_;
  std::condition_variable changed_;
  bool cancelled_ = false;
  bool created_ = false;
  void* context_ = nullptr;  // the grpc::ClientContext of the open stream, to cancel it
  std::thread thread_;
};

}  // namespace keel
