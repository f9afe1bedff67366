// How a get waits without missing a write: the waiter is registered for its keys first, then
// the keys are read; a read that started after the store's prefix watch was open leaves the
// rest to the watch (etcd delivers every write after the watch's start revision), and the
// watch's callback hands each put of a registered key to its waiters. Only registered keys
// are looked at: the store holds every step's records, and no value is kept beyond its get.
#include "launcher/etcd/etcd_store.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

#include <sodium.h>

#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/etcd_watch.h"

namespace keel {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The shortest deadline of a read inside get and wait, even when the caller's timeout is
// shorter or has passed: a key that exists is found (TcpStore answers get(key, 0) too), and a
// lost etcd costs a caller at most this much past its timeout.
constexpr milliseconds kMinRead(250);
// How long opening the watch may hold up a get: EtcdWatch waits for etcd to confirm the watch
// for its client's whole timeout, so the watch has a client of its own with this one.
constexpr milliseconds kWatchOpen(1000);
// A waiter covered by the watch still reads its keys again this often: a watch served by a
// member that a partition cut off stays open and silent until gRPC's keepalive gives up on
// it (7 s), and one that was away longer than etcd keeps old revisions (1 min,
// etcd_members.cc) resumes without the writes it missed; a waiter must not sleep through
// its key then. A read a second per waiting rank, while it waits.
constexpr milliseconds kRecheck(1000);
// A waiter without the watch (it could not be opened) reads this often instead.
constexpr milliseconds kPoll(100);

constexpr std::string_view kScheme = "etcd://";
// The same with TLS to every endpoint (members keel started, launcher/etcd/etcd_tls.h).
constexpr std::string_view kTlsScheme = "etcds://";

struct Waiter {
  std::set<std::string> missing;  // etcd keys not seen yet
  std::string value;              // the value of the last key found (get waits for one)

  void found(const std::string& key, const std::string& v) {
    if (missing.erase(key)) value = v;
  }
};

// A token no other try of any process writes: 16 random bytes, in hex.
std::string unique_token() {
  KEEL_CHECK(sodium_init() >= 0, "sodium_init failed (no random source?)");
  unsigned char b[16];
  randombytes_buf(b, sizeof(b));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) out += {kHex[c >> 4], kHex[c & 15]};
  return out;
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

}  // namespace

struct EtcdStore::Impl {
  Impl(const std::vector<std::string>& endpoints, std::string p, milliseconds call_timeout,
       EtcdRead r)
      : prefix(std::move(p)),
        reads(r),
        client(endpoints, call_timeout),
        watch_client(endpoints, kWatchOpen) {
    if (prefix.empty()) throw InputError("etcd store: empty key prefix");
  }

  std::string prefix;
  EtcdRead reads;  // try_get's and add(key, 0)'s
  EtcdClient client;
  EtcdClient watch_client;
  std::mutex mu;  // guards waiters and the Waiters they point to
  std::condition_variable found;
  std::unordered_multimap<std::string, Waiter*> waiters;  // by etcd key
  std::atomic<bool> watching{false};
  std::mutex watch_mu;
  std::unique_ptr<EtcdWatch> watch;  // declared last: ends (joins its thread) first

  std::string where() const { return "rendezvous store (etcd " + prefix + ")"; }

  std::function<EtcdGuard()> fence;  // empty: writes are not fenced

  // The guard of a fenced write now; throws LostLeadership when there is no leadership.
  EtcdGuard guard(const std::string& op) const {
    EtcdGuard g = fence();
    if (g.key.empty())
      throw LostLeadership(where() + ": " + op + ": not written: this process does not lead");
    return g;
  }
  // A fenced write that etcd refused: the guard did not hold.
  [[noreturn]] void refused(const std::string& op, const EtcdGuard& g) const {
    throw LostLeadership(where() + ": etcd refused the fenced " + op + ": " + g.key + " @" +
                         std::to_string(g.create_revision) + " no longer leads");
  }

  // Runs an etcd call of a Store method: a lost quorum is a CommError, the data plane's
  // failure to survive, never an EtcdUnavailable the caller does not know of.
  template <typename F>
  auto guarded(const std::string& op, F&& f) {
    try {
      return f();
    } catch (const EtcdUnavailable& e) {
      throw CommError(where() + ": " + op + ": etcd unavailable: " + e.what());
    }
  }

  void on_events(const std::vector<EtcdEvent>& events) {
    std::lock_guard lock(mu);
    if (waiters.empty()) return;
    bool any = false;
    for (const EtcdEvent& e : events) {
      if (e.type != EtcdEvent::Type::kPut) continue;
      auto [it, end] = waiters.equal_range(e.kv.key);
      for (; it != end; ++it) {
        it->second->found(e.kv.key, e.kv.value);
        any = true;
      }
    }
    if (any) found.notify_all();
  }

  // Opens the prefix watch unless it is open. False, with *why, when etcd did not confirm it
  // within kWatchOpen.
  bool open_watch(std::string* why) {
    std::lock_guard lock(watch_mu);
    if (watch) return true;
    try {
      watch = std::make_unique<EtcdWatch>(watch_client, prefix, true,
                                          [this](const auto& events) { on_events(events); });
    } catch (const EtcdUnavailable& e) {
      *why = e.what();
      return false;
    }
    watching = true;
    return true;
  }

  // Reads w's missing keys. False, with *why, when etcd did not answer one by the caller's
  // deadline (kMinRead at least, the call timeout at most).
  bool read_missing(Waiter& w, Clock::time_point deadline, std::string* why) {
    std::vector<std::string> keys;
    {
      std::lock_guard lock(mu);
      keys.assign(w.missing.begin(), w.missing.end());
    }
    for (const auto& key : keys) {
      const auto now = Clock::now();
      const auto left = std::min<Clock::duration>(
          std::max<Clock::duration>(deadline - now, kMinRead), client.timeout());
      try {
        std::optional<EtcdKeyValue> kv = client.get(key, now + left);
        std::lock_guard lock(mu);
        if (kv) w.found(key, kv->value);
      } catch (const EtcdUnavailable& e) {
        *why = e.what();
        return false;
      }
    }
    return true;
  }

  // get (one key) and wait: the value of the last key found.
  std::string wait_for(const std::vector<std::string>& keys, milliseconds timeout) {
    const auto start = Clock::now();
    const auto deadline = start + std::max(timeout, milliseconds(0));
    Waiter w;
    for (const auto& k : keys) w.missing.insert(prefix + k);
    if (w.missing.empty()) return {};
    // Registered before the first read, so that the watch hands it any write the read misses.
    {
      std::lock_guard lock(mu);
      for (const auto& k : w.missing) waiters.emplace(k, &w);
    }
    struct Unregister {
      Impl* impl;
      Waiter* w;
      std::vector<std::string> keys;
      ~Unregister() {
        std::lock_guard lock(impl->mu);
        for (const auto& k : keys) {
          auto [it, end] = impl->waiters.equal_range(k);
          while (it != end) it = it->second == w ? impl->waiters.erase(it) : std::next(it);
        }
      }
    } unregister{this, &w, {w.missing.begin(), w.missing.end()}};

    std::string why;       // why etcd did not answer the last read ("": it did)
    bool covered = false;  // a read began with the watch open: the watch delivers the rest
    auto next_read = start;
    for (;;) {
      const bool open = watching.load();
      // The deadline's read too: the key may have come with a write the watch has not
      // delivered yet, and otherwise the timeout learns whether etcd was there.
      if (!covered || Clock::now() >= next_read || Clock::now() >= deadline) {
        const bool answered = read_missing(w, deadline, &why);
        if (answered) why.clear();
        covered = answered && open;
        next_read = Clock::now() + (covered ? kRecheck : kPoll);
      }
      std::unique_lock lock(mu);
      if (w.missing.empty()) return w.value;
      if (Clock::now() >= deadline) break;
      // Opened only while etcd answers: otherwise opening would hold the caller for up to
      // kWatchOpen past its timeout, and the reads above retry anyway.
      if (!open && why.empty()) {
        lock.unlock();
        if (open_watch(&why)) continue;  // read again, now covered
        lock.lock();
      }
      found.wait_until(lock, std::min(deadline, next_read), [&] { return w.missing.empty(); });
      if (w.missing.empty()) return w.value;
    }
    std::vector<std::string> missing;
    {
      std::lock_guard lock(mu);
      for (const auto& k : keys)
        if (w.missing.contains(prefix + k)) missing.push_back(k);
    }
    const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    throw CommTimeout(where() + ": timed out after " + std::to_string(waited.count()) +
                      " ms waiting for key(s): " + join(missing, ", ") +
                      (why.empty() ? "" : "; etcd unavailable: " + why));
  }
};

EtcdStore::EtcdStore(const std::vector<std::string>& endpoints, std::string prefix,
                     std::chrono::milliseconds call_timeout, EtcdRead reads)
    : impl_(std::make_unique<Impl>(endpoints, std::move(prefix), call_timeout, reads)) {}

EtcdStore::~EtcdStore() = default;

const std::string& EtcdStore::prefix() const {
  return impl_->prefix;
}

void EtcdStore::fence(std::function<EtcdGuard()> leader) {
  impl_->fence = std::move(leader);
}

void EtcdStore::set(const std::string& key, const std::string& value) {
  set_all({{key, value}});
}

void EtcdStore::set_all(const std::vector<std::pair<std::string, std::string>>& kvs) {
  if (kvs.empty()) return;
  std::vector<std::pair<std::string, std::string>> full;
  for (const auto& [k, v] : kvs) full.emplace_back(impl_->prefix + k, v);
  const std::string op =
      kvs.size() == 1 ? "set " + kvs.front().first
                      : "set " + std::to_string(kvs.size()) + " keys from " + kvs.front().first;
  if (!impl_->fence) {
    impl_->guarded(op, [&] {
      if (full.size() == 1)
        impl_->client.put(full.front().first, full.front().second);
      else
        impl_->client.put_all(full);
      return 0;
    });
    return;
  }
  for (size_t first = 0; first < full.size(); first += EtcdClient::kMaxTxnOps) {
    const std::vector<std::pair<std::string, std::string>> part(
        full.begin() + first, full.begin() + std::min(full.size(), first + EtcdClient::kMaxTxnOps));
    const EtcdGuard g = impl_->guard(op);
    if (!impl_->guarded(op, [&] { return impl_->client.put_all_if(g, part); }))
      impl_->refused(op, g);
  }
}

std::string EtcdStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return impl_->wait_for({key}, timeout);
}

void EtcdStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  impl_->wait_for(keys, timeout);
}

std::optional<std::string> EtcdStore::try_get(const std::string& key) {
  std::optional<EtcdKeyValue> kv = impl_->guarded("try_get " + key, [&] {
    return impl_->client.get(impl_->prefix + key, Clock::now() + impl_->client.timeout(),
                             impl_->reads);
  });
  if (!kv) return std::nullopt;
  return std::move(kv->value);
}

std::optional<Store::KeyValues> EtcdStore::try_get_prefix(const std::string& prefix) {
  std::vector<EtcdKeyValue> kvs = impl_->guarded(
      "get prefix " + prefix, [&] { return impl_->client.get_prefix(impl_->prefix + prefix); });
  KeyValues out;
  out.reserve(kvs.size());
  for (EtcdKeyValue& kv : kvs)
    if (!kv.key.ends_with(kEtcdWriterSuffix))  // a counter's last writer: not a key of the store
      out.emplace_back(kv.key.substr(impl_->prefix.size()), std::move(kv.value));
  return out;
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  const std::string full = impl_->prefix + key;
  // A counter's read may be local; the base of a write is not (a stale base only costs a
  // retry, but a lost quorum fails the write all the same).
  std::optional<EtcdKeyValue> kv = impl_->guarded("add " + key, [&] {
    return impl_->client.get(full, Clock::now() + impl_->client.timeout(),
                             delta == 0 ? impl_->reads : EtcdRead::kLinearizable);
  });
  for (;;) {
    int64_t value = 0;
    if (kv) {
      const std::string& s = kv->value;
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
      if (ec != std::errc() || end != s.data() + s.size())
        throw Error("rendezvous store: add: the value of key '" + key + "' is not an integer");
    }
    // add(key, 0) is how counters are read (the detector's poll of a rank's errors): a read,
    // not a write to etcd.
    if (delta == 0) return value;
    // Wraps like the machine's add instead of overflowing into undefined behaviour.
    value = static_cast<int64_t>(static_cast<uint64_t>(value) + static_cast<uint64_t>(delta));
    const int64_t revision = kv ? kv->mod_revision : 0;
    // A token of this try: a retry of a write that was applied but whose answer was lost
    // must not add twice (an incident counted without its record, seen in the soak).
    const std::string writer = unique_token();
    std::optional<EtcdGuard> g;
    if (impl_->fence) g = impl_->guard("add " + key);
    if (impl_->guarded("add " + key, [&] {
          return impl_->client.put_if_unchanged(full, revision, std::to_string(value), &kv, writer,
                                                g ? &*g : nullptr);
        }))
      return value;
    // Another writer came first: *kv is its write, the base of the next try.
  }
}

void EtcdStore::erase(const std::vector<std::string>& keys,
                      const std::vector<std::string>& prefixes) {
  auto erase_one = [&](const std::string& k, bool prefix) {
    const std::string op = (prefix ? "erase prefix " : "erase ") + k;
    const std::string full = impl_->prefix + k;
    if (!impl_->fence) {
      impl_->guarded(op, [&] {
        return prefix ? impl_->client.erase_prefix(full) : impl_->client.erase(full);
      });
      return;
    }
    const EtcdGuard g = impl_->guard(op);
    if (!impl_->guarded(op, [&] { return impl_->client.erase_if(g, full, prefix); }))
      impl_->refused(op, g);
  };
  for (const auto& k : keys) erase_one(k, false);
  for (const auto& p : prefixes) erase_one(p, true);
}

bool is_etcd_store_address(const std::string& address) {
  return address.starts_with(kScheme) || address.starts_with(kTlsScheme);
}

std::string etcd_store_address(const std::vector<std::string>& endpoints,
                               const std::string& prefix) {
  if (endpoints.empty()) throw InputError("etcd store address: no endpoints");
  std::vector<std::string> hosts;
  const bool tls = endpoints.front().starts_with(kEtcdTlsScheme);
  for (std::string e : endpoints) {
    if (e.starts_with(kEtcdTlsScheme) != tls)
      throw InputError("etcd store address: endpoints with and without TLS (" + endpoints.front() +
                       ", " + e + ")");
    if (tls) e = e.substr(std::strlen(kEtcdTlsScheme));
    if (e.starts_with("http://")) e = e.substr(7);
    if (e.empty() || e.find_first_of(",/") != std::string::npos)
      throw InputError("etcd store address: bad endpoint '" + e + "' (expected host:port)");
    hosts.push_back(e);
  }
  if (!prefix.starts_with('/'))
    throw InputError("etcd store address: the key prefix '" + prefix + "' must start with '/'");
  return std::string(tls ? kTlsScheme : kScheme) + join(hosts, ",") + prefix;
}

std::string with_etcd_endpoints(const std::string& address,
                                const std::vector<std::string>& endpoints) {
  if (!is_etcd_store_address(address) || endpoints.empty()) return address;
  const bool tls = address.starts_with(kTlsScheme);
  const std::string rest = address.substr(tls ? kTlsScheme.size() : kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string::npos) return address;
  return etcd_store_address(endpoints, rest.substr(slash));
}

std::shared_ptr<Store> connect_fenced_etcd_store(const std::string& address,
                                                 std::function<EtcdGuard()> leader,
                                                 std::chrono::milliseconds call_timeout) {
  std::shared_ptr<Store> s = connect_etcd_store(address, call_timeout);
  static_cast<EtcdStore&>(*s).fence(std::move(leader));
  return s;
}

std::shared_ptr<Store> connect_etcd_store(const std::string& address,
                                          std::chrono::milliseconds call_timeout, EtcdRead reads) {
  auto bad = [&](const std::string& why) {
    return InputError("bad etcd store address '" + address + "': " + why +
                      " (expected etcd[s]://host:port,...,host:port/key/prefix/)");
  };
  if (!is_etcd_store_address(address)) throw bad("no etcd:// scheme");
  const bool tls = address.starts_with(kTlsScheme);
  const std::string rest = address.substr(tls ? kTlsScheme.size() : kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string::npos) throw bad("no key prefix");
  std::vector<std::string> endpoints;
  for (size_t begin = 0; begin <= slash;) {
    size_t end = std::min(rest.find(',', begin), slash);
    if (end == begin) throw bad("an empty endpoint");
    endpoints.push_back((tls ? kEtcdTlsScheme : "") + rest.substr(begin, end - begin));
    begin = end + 1;
  }
  try {
    return std::make_shared<EtcdStore>(endpoints, rest.substr(slash), call_timeout, reads);
  } catch (const InputError& e) {
    throw bad(e.what());
  }
}

}  // namespace keel
