// A view of the job's store that may go out of reach for a while: the store in etcd without
// quorum (DESIGN.md, Control state and failover). Losing quorum pauses decisions, never the
// training: every call that finds the store unavailable (CommError other than a wait's own
// CommTimeout) is tried again, `idle` running between the tries, until `patience`
// (detect.quorum_timeout_ms) has passed without an answer; then QuorumLost. The controller
// stops the job cleanly on it (its agents answered meanwhile by `idle`); a rank's recovery
// protocol uses it too, so that a failure during the outage is reported once it ends.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/store.h"
#include "runtime/check.h"

namespace keel {

class LostLeadership;

// No write reached a quorum of etcd within detect.quorum_timeout_ms.
class QuorumLost : public Error {
 public:
  using Error::Error;
};

class PatientStore : public Store {
 public:
  // While one lives on this thread, calls are not retried and go to the quick store, if one
  // was given: a look the controller takes in passing (a poll for the ranks' errors) answers
  // or fails within the quick store's deadline, and is skipped on a CommError, instead of
  // holding up the loop that also watches exits and agents.
  class Quick {
   public:
    Quick();
    ~Quick();
    Quick(const Quick&) = delete;
    Quick& operator=(const Quick&) = delete;
  };

  // `before`, if given, runs before every write: the controller's check that it still leads
  // (EtcdControlState::check_leading, which throws Deposed once another does), so that a
  // deposed controller writes nothing to the ranks' store; and after any call that found the
  // store out of reach before it answered, so that a controller cut off and back learns that
  // another leads before it acts on what it read. `quick`, if given, is the same
  // store behind short deadlines (etcd_store.h, kEtcdQuickCall), for Quick
  // scopes: a poll must not wait out a member that is gone or a quorum that is lost.
  // `refused`, if given, runs when etcd refused a fenced write (LostLeadership from a store
  // fenced on the leadership, etcd_store.h): it tells the leadership it is lost, whatever
  // the lease's own clock said, so that `before` then campaigns again (the write is tried
  // again under the new term if no other controller led meanwhile) or throws Deposed.
  // Without it, the refusal reaches the caller.
  PatientStore(std::shared_ptr<Store> inner, std::chrono::milliseconds patience,
               std::function<void()> idle, std::function<void()> before = {},
               std::shared_ptr<Store> quick = nullptr,
               std::function<void(const std::string&)> refused = {});

  void set(const std::string& key, const std::string& value) override;
  void set_all(const std::vector<std::pair<std::string, std::string>>& kvs) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void erase(const std::vector<std::string>& keys,
             const std::vector<std::string>& prefixes) override;
  std::optional<KeyValues> try_get_prefix(const std::string& prefix) override;

 private:
  // Runs `f` until it returns or `patience` passes with the store out of reach; a `write`
  // first checks that this controller still leads.
  template <class F>
  auto patiently(const std::string& what, bool write, F&& f) -> decltype(f(std::declval<Store&>()));

  // A write etcd refused (its fence): tells the leadership and asks `before` again, which
  // throws Deposed when another leads. False when this store has no one to tell (the
  // refusal is then the caller's).
  bool learn_refusal(const LostLeadership& e, bool write);

  std::shared_ptr<Store> inner_;
  std::shared_ptr<Store> quick_;
  std::chrono::milliseconds patience_;
  std::function<void()> idle_;
  std::function<void()> before_;
  std::function<void(const std::string&)> refused_;
  bool in_idle_ = false;  // idle() may use the store itself: it waits without re-entering idle
};

}  // namespace keel
