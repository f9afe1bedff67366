#include "launcher/patient_store.h"

#include <thread>

#include "launcher/etcd/etcd_error.h"
#include "runtime/logging.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// Between two tries: short against the quorum timeout, long against a member's reply.
constexpr std::chrono::milliseconds kRetryPause{200};

thread_local int g_quick = 0;  // Quick scopes open on this thread

}  // namespace

PatientStore::Quick::Quick() {
  ++g_quick;
}
PatientStore::Quick::~Quick() {
  --g_quick;
}

PatientStore::PatientStore(std::shared_ptr<Store> inner, std::chrono::milliseconds patience,
                           std::function<void()> idle, std::function<void()> before,
                           std::shared_ptr<Store> quick,
                           std::function<void(const std::string&)> refused)
    : inner_(std::move(inner)),
      quick_(std::move(quick)),
      patience_(patience),
      idle_(std::move(idle)),
      before_(std::move(before)),
      refused_(std::move(refused)) {}

bool PatientStore::learn_refusal(const LostLeadership& e, bool write) {
  if (!write || !refused_ || !before_) return false;
  refused_(e.what());
  before_();  // throws Deposed when another controller leads now
  return true;
}

template <class F>
auto PatientStore::patiently(const std::string& what, bool write, F&& f)
    -> decltype(f(std::declval<Store&>())) {
  // A look in passing: once, on the quick store if there is one.
  if (g_quick > 0) {
    try {
      return f(quick_ ? *quick_ : *inner_);
    } catch (const LostLeadership& e) {
      // Refused by etcd in passing: the leadership learns it (before() throws Deposed when
      // another leads), and the caller skips this look as it skips one out of reach.
      if (!learn_refusal(e, write)) throw;
      throw CommError(what + ": refused by etcd's fence; tried again on the next look");
    }
  }
  if (write && before_) before_();
  const auto deadline = Clock::now() + patience_;
  bool said = false;
  while (true) {
    try {
      auto out = f(*inner_);
      if (said) {
        LOG(WARNING) << "the job's store answers again (" << what << ")";
        // Out of reach meanwhile, this process may have lost its place (a controller cut
        // off and back, another leading now): it must know before it acts on the answer.
        if (before_) before_();
      }
      return out;
    } catch (const CommTimeout&) {
      throw;  // a wait that ran out: the caller's own answer
    } catch (const LostLeadership& e) {
      // etcd refused a fenced write: whatever the lease's clock says, this process did not
      // lead when the write arrived. Nothing was written; the leadership learns it, and the
      // write is tried again only if `before` finds this process leading again (no other
      // controller led meanwhile), else Deposed ends its part.
      if (!learn_refusal(e, write)) throw;
      if (Clock::now() > deadline)
        throw QuorumLost(detail::concat("the job's store took no ", what, " for ",
                                        patience_.count(),
                                        " ms (detect.quorum_timeout_ms): ", e.what()));
      continue;
    } catch (const CommError& e) {
      if (Clock::now() > deadline)
        throw QuorumLost(detail::concat("the job's store took no ", what, " for ",
                                        patience_.count(),
                                        " ms (detect.quorum_timeout_ms): ", e.what()));
      if (!said)
        LOG(WARNING) << "the job's store is out of reach (" << e.what()
                     << "): decisions wait, training goes on";
      said = true;
    }
    if (idle_ && !in_idle_) {
      in_idle_ = true;
      try {
        idle_();
      } catch (...) {
        in_idle_ = false;
        throw;
      }
      in_idle_ = false;
    }
    std::this_thread::sleep_for(kRetryPause);
  }
}

void PatientStore::set(const std::string& key, const std::string& value) {
  patiently("set " + key, true, [&](Store& s) {
    s.set(key, value);
    return 0;
  });
}

void PatientStore::set_all(const std::vector<std::pair<std::string, std::string>>& kvs) {
  patiently("set of " + std::to_string(kvs.size()) + " keys", true, [&](Store& s) {
    s.set_all(kvs);
    return 0;
  });
}

std::string PatientStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return patiently("get " + key, false, [&](Store& s) { return s.get(key, timeout); });
}

std::optional<std::string> PatientStore::try_get(const std::string& key) {
  return patiently("get " + key, false, [&](Store& s) { return s.try_get(key); });
}

void PatientStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  patiently("wait", false, [&](Store& s) {
    s.wait(keys, timeout);
    return 0;
  });
}

int64_t PatientStore::add(const std::string& key, int64_t delta) {
  return patiently("add " + key, delta != 0, [&](Store& s) { return s.add(key, delta); });
}

std::optional<Store::KeyValues> PatientStore::try_get_prefix(const std::string& prefix) {
  return patiently("get prefix " + prefix, false,
                   [&](Store& s) { return s.try_get_prefix(prefix); });
}

void PatientStore::erase(const std::vector<std::string>& keys,
                         const std::vector<std::string>& prefixes) {
  patiently("erase", true, [&](Store& s) {
    s.erase(keys, prefixes);
    return 0;
  });
}

}  // namespace keel
