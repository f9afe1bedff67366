// Wire protocol: every message is a frame, a little-endian u32 byte count followed by that
// many bytes. A request is an op byte and its fields; a reply is a status byte and its
// fields. Strings are a u32 length and the bytes. Waiting happens on the server, which keeps
// each blocked client's request with its deadline and answers when the keys appear or the
// deadline passes; the client only adds a margin for a server that stops answering.
#include "parallel/tcp_store.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <thread>
#include <unordered_map>

#include "parallel/peer_auth.h"
#include "parallel/sealed_channel.h"
#include "runtime/check.h"

namespace keel {
namespace {

using detail::Clock;
using detail::concat;
using detail::Fd;
using detail::IoResult;

enum Op : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kErase = 5, kTryGet = 6 };
enum Status : uint8_t { kOk = 0, kTimedOut = 1, kFailed = 2 };

// Bigger frames are a corrupt stream or a misuse; the store holds addresses and counters.
constexpr uint32_t kMaxFrame = 1u << 30;

struct Writer {
  std::string buf;
  void u8(uint8_t v) { buf.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<char>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<char>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    buf += s;
  }
  // The payload with its length prefix.
  std::string frame() const {
    Writer w;
    w.u32(static_cast<uint32_t>(buf.size()));
    return w.buf + buf;
  }
};

uint64_t load_le(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Reads fields of one payload; any overrun throws (a corrupt or hostile frame).
struct Reader {
  const std::string& buf;
  size_t pos = 0;
  void need(size_t n) {
    if (buf.size() - pos < n) throw Error("tcp store: truncated message");
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(buf[pos++]);
  }
  uint32_t u32() {
    need(4);
    pos += 4;
    return static_cast<uint32_t>(load_le(buf.data() + pos - 4, 4));
  }
  uint64_t u64() {
    need(8);
    pos += 8;
    return load_le(buf.data() + pos - 8, 8);
  }
  std::string str() {
    uint32_t n = u32();
    need(n);
    pos += n;
    return buf.substr(pos - n, n);
  }
  // A count of strings: each takes 4 bytes at least, so a count the message cannot hold is
  // refused before anything is allocated for it (2^32 - 1 asked for 128 GiB).
  uint32_t count_of_strings() {
    const uint32_t n = u32();
    if (n > (buf.size() - pos) / 4) throw Error("tcp store: a count larger than its message");
    return n;
  }
};

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

struct Client {
  Fd fd;
  // The job-key handshake, until it is done no byte is taken as a request.
  ServerHandshake auth{AuthChannel{"store", 0}};
  Clock::time_point accepted_at = Clock::now();
  std::string in;   // received bytes not yet parsed into frames
  std::string out;  // replies not yet sent
  // A client on another machine: its bytes are sealed records (parallel/sealed_channel.h),
  // opened from `wire` into `in`, and replies sealed into `out`.
  std::unique_ptr<RecordCipher> seal_in, seal_out;
  std::string wire;
  bool dead = false;
  // A blocked get/wait: the op, its keys and when to give up.
  bool waiting = false;
  Op wait_op = kWait;
  std::vector<std::string> wait_keys;
  Clock::time_point deadline;
};

bool authenticated(const Client& c) {
  return c.auth.state() == ServerHandshake::State::kDone;
}

}  // namespace

std::pair<std::string, int> parse_host_port(const std::string& addr) {
  auto bad = [&](const char* why) {
    return InputError(concat("bad address '", addr, "': ", why, " (expected host:port)"));
  };
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos) throw bad("no port");
  std::string host = addr.substr(0, colon);
  std::string port_text = addr.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  else if (host.find(':') != std::string::npos)
    throw bad("an IPv6 host must be in brackets");
  if (host.empty()) throw bad("empty host");
  int port = -1;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
      port < 0 || port > 65535)
    throw bad("port is not a number in [0, 65535]");
  return {host, port};
}

// ---------------------------------------------------------------------------------------
// Server

struct TcpStoreServer::Impl {
  int port = 0;
  Fd listener;
  Fd wake;
  std::thread thread;
  std::once_flag stopped;
  // Touched by the serving thread only.
  std::unordered_map<std::string, std::string> data;
  std::vector<std::unique_ptr<Client>> clients;

  void serve();
  void accept_clients();
  void read_client(Client& c);
  void flush(Client& c);
  void process(Client& c);
  void handle(Client& c, const std::string& payload);
  bool try_answer(Client& c);
  void reply(Client& c, const Writer& w) {
    const std::string frame = w.frame();
    if (!c.seal_out) {
      c.out += frame;
    } else {
      for (size_t off = 0; off < frame.size(); off += SealedChannel::kMaxRecord) {
        const size_t n = std::min(SealedChannel::kMaxRecord, frame.size() - off);
        const size_t at = c.out.size();
        c.out.resize(at + RecordCipher::kHeaderBytes + n + RecordCipher::kTagBytes);
        c.seal_out->seal(frame.data() + off, n, reinterpret_cast<uint8_t*>(c.out.data() + at));
      }
    }
    flush(c);
  }
  // Opens the whole records in c.wire into c.in; false if one fails its check.
  bool open_records(Client& c);
  void notify_waiters() {
    for (auto& c : clients)
      if (c->waiting && !c->dead && try_answer(*c)) process(*c);
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port) : impl_(new Impl) {
  impl_->listener = detail::listen_tcp(host, port, 128);
  impl_->port = detail::local_port(impl_->listener.get());
  impl_->wake = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  KEEL_CHECK_ERRNO(impl_->wake.get());
  prepare_sealing();  // here, not first on the serving thread while this one may fork
  impl_->thread = std::thread([impl = impl_.get()] { impl->serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  stop();
}

int TcpStoreServer::port() const {
  return impl_->port;
}

void TcpStoreServer::stop() {
  std::call_once(impl_->stopped, [this] {
    uint64_t one = 1;
    KEEL_CHECK(::write(impl_->wake.get(), &one, sizeof(one)) == sizeof(one));
    impl_->thread.join();
    impl_->clients.clear();
    impl_->listener.reset();
  });
}

void TcpStoreServer::Impl::serve() {
  std::vector<pollfd> pfds;
  for (;;) {
    pfds.clear();
    pfds.push_back({wake.get(), POLLIN, 0});
    pfds.push_back({listener.get(), POLLIN, 0});
    Clock::time_point next = Clock::time_point::max();
    for (auto& c : clients) {
      short ev = POLLIN;
      if (!c->out.empty()) ev |= POLLOUT;
      pfds.push_back({c->fd.get(), ev, 0});
      if (c->waiting) next = std::min(next, c->deadline);
      if (!authenticated(*c)) next = std::min(next, c->accepted_at + kHandshakeTimeout);
    }
    int ms = next == Clock::time_point::max() ? -1 : detail::poll_ms_left(next);
    int rc = ::poll(pfds.data(), pfds.size(), ms);
    if (rc < 0 && errno == EINTR) continue;
    // The server thread has no caller to throw to; a failing poll() means a broken process.
    KEEL_CHECK(rc >= 0, "tcp store server: poll: ", std::strerror(errno));
    if (pfds[0].revents) return;
    if (pfds[1].revents) accept_clients();
    // New clients were appended after the polled ones, so indices still line up.
    for (size_t i = 2; i < pfds.size(); ++i) {
      Client& c = *clients[i - 2];
      if (pfds[i].revents & POLLOUT) flush(c);
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_client(c);
    }
    auto now = Clock::now();
    for (auto& c : clients) {
      // A connection that never proves the key holds a descriptor: not for long.
      if (!authenticated(*c) && now - c->accepted_at >= kHandshakeTimeout) c->dead = true;
      if (!c->waiting || c->dead || c->deadline > now) continue;
      Writer w;
      w.u8(kTimedOut);
      std::vector<std::string> missing;
      for (const auto& k : c->wait_keys)
        if (!data.contains(k)) missing.push_back(k);
      w.u32(static_cast<uint32_t>(missing.size()));
      for (const auto& k : missing) w.str(k);
      c->waiting = false;
      reply(*c, w);
      process(*c);
    }
    std::erase_if(clients, [](const auto& c) { return c->dead; });
  }
}

void TcpStoreServer::Impl::accept_clients() {
  for (;;) {
    int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a connection that died before we took it
    auto c = std::make_unique<Client>();
    c->fd = Fd(fd);
    detail::set_nodelay(fd);
    clients.push_back(std::move(c));
    // A flood of connections that never authenticate must not crowd out the job's own: the
    // oldest such one goes.
    auto pending = [](const auto& x) { return !x->dead && !authenticated(*x); };
    if (std::count_if(clients.begin(), clients.end(), pending) > kMaxPendingHandshakes)
      (*std::find_if(clients.begin(), clients.end(), pending))->dead = true;
  }
}

void TcpStoreServer::Impl::read_client(Client& c) {
  if (!authenticated(c)) {
    ServerHandshake::State a = c.auth.pump(c.fd.get());
    if (a == ServerHandshake::State::kRefused) c.dead = true;
    if (a != ServerHandshake::State::kDone) return;
    if (seals(c.fd.get())) {
      c.seal_in = std::make_unique<RecordCipher>(c.auth.keys().to_server, false);
      c.seal_out = std::make_unique<RecordCipher>(c.auth.keys().to_client, true);
    }
  }
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      (c.seal_in ? c.wire : c.in).append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c.dead = true;
    break;
  }
  if (c.seal_in && !open_records(c)) c.dead = true;
  if (!c.dead) process(c);
}

bool TcpStoreServer::Impl::open_records(Client& c) {
  constexpr size_t kHeader = RecordCipher::kHeaderBytes, kTag = RecordCipher::kTagBytes;
  size_t off = 0;
  while (c.wire.size() - off >= kHeader) {
    auto* rec = reinterpret_cast<uint8_t*>(c.wire.data() + off);
    const size_t n = RecordCipher::length(rec);
    if (n == 0 || n > SealedChannel::kMaxRecord) {
      note_refusal(concat("a store connection from ", peer_address(c.fd.get()),
                          ": a sealed record of ", n, " bytes: garbled"));
      return false;
    }
    if (c.wire.size() - off < kHeader + n + kTag) break;
    if (!c.seal_in->open(rec, rec + kHeader, n, rec + kHeader + n)) {
      note_refusal(concat("a store connection from ", peer_address(c.fd.get()),
                          ": a sealed record failed its check (altered in flight, replayed, or "
                          "not of this connection)"));
      return false;
    }
    c.in.append(reinterpret_cast<const char*>(rec + kHeader), n);
    off += kHeader + n + kTag;
  }
  c.wire.erase(0, off);
  return true;
}

void TcpStoreServer::Impl::flush(Client& c) {
  size_t sent = 0;
  while (sent < c.out.size()) {
    ssize_t n =
        ::send(c.fd.get(), c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
    break;
  }
  c.out.erase(0, sent);
}

void TcpStoreServer::Impl::process(Client& c) {
  // A client sends its next request only after the reply to the last one, so a blocked
  // client has nothing more to parse; stopping here keeps replies in request order anyway.
  while (!c.waiting && !c.dead && c.in.size() >= 4) {
    uint32_t len = static_cast<uint32_t>(load_le(c.in.data(), 4));
    if (len > kMaxFrame) {
      c.dead = true;
      return;
    }
    if (c.in.size() < 4 + size_t(len)) return;
    std::string payload = c.in.substr(4, len);
    c.in.erase(0, 4 + size_t(len));
    try {
      handle(c, payload);
    } catch (const std::exception&) {
      // A malformed request (or one the server could not hold): drop the client rather
      // than guess, and never let it end the server's thread, which serves the whole job.
      c.dead = true;
    }
  }
}

void TcpStoreServer::Impl::handle(Client& c, const std::string& payload) {
  Reader r{payload};
  uint8_t op = r.u8();
  if (op == kSet) {
    std::string key = r.str();
    data[key] = r.str();
    Writer w;
    w.u8(kOk);
    reply(c, w);
    notify_waiters();
  } else if (op == kAdd) {
    std::string key = r.str();
    int64_t delta = static_cast<int64_t>(r.u64());
    int64_t value = 0;
    auto it = data.find(key);
    Writer w;
    if (it != data.end()) {
      const std::string& s = it->second;
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
      if (ec != std::errc() || end != s.data() + s.size()) {
        w.u8(kFailed);
        w.str(concat("add: the value of key '", key, "' is not an integer"));
        reply(c, w);
        return;
      }
    }
    value += delta;
    data[key] = std::to_string(value);
    w.u8(kOk);
    w.u64(static_cast<uint64_t>(value));
    reply(c, w);
    notify_waiters();
  } else if (op == kErase) {
    for (uint32_t i = 0, n = r.count_of_strings(); i < n; ++i) data.erase(r.str());
    std::vector<std::string> prefixes(r.count_of_strings());
    for (auto& p : prefixes) p = r.str();
    std::erase_if(data, [&](const auto& kv) {
      return std::any_of(prefixes.begin(), prefixes.end(),
                         [&](const std::string& p) { return kv.first.starts_with(p); });
    });
    Writer w;
    w.u8(kOk);
    reply(c, w);
  } else if (op == kTryGet) {
    // Answered at once: 1 and the value, or 0 when the key does not exist.
    auto it = data.find(r.str());
    Writer w;
    w.u8(kOk);
    w.u8(it != data.end() ? 1 : 0);
    if (it != data.end()) w.str(it->second);
    reply(c, w);
  } else if (op == kGet || op == kWait) {
    uint64_t timeout_ms = r.u64();
    uint32_t n = r.u32();
    if (op == kGet && n != 1) throw Error("tcp store: get takes one key");
    c.wait_keys.clear();
    for (uint32_t i = 0; i < n; ++i) c.wait_keys.push_back(r.str());
    c.wait_op = static_cast<Op>(op);
    c.deadline =
        Clock::now() + std::chrono::milliseconds(std::min<uint64_t>(timeout_ms, 1ull << 40));
    c.waiting = true;
    try_answer(c);
  } else {
    throw Error("tcp store: unknown op");
  }
}

// Answers c's blocked request if all its keys exist now.
bool TcpStoreServer::Impl::try_answer(Client& c) {
  for (const auto& k : c.wait_keys)
    if (!data.contains(k)) return false;
  Writer w;
  w.u8(kOk);
  if (c.wait_op == kGet) w.str(data[c.wait_keys[0]]);
  c.waiting = false;
  reply(c, w);
  return true;
}

// ---------------------------------------------------------------------------------------
// Client

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds connect_timeout)
    : addr_(detail::join_host_port(host, port)), op_timeout_(connect_timeout) {
  const auto deadline = Clock::now() + connect_timeout;
  fd_ = detail::connect_tcp(host, port, deadline, "the rendezvous store");
  detail::set_nodelay(fd_.get());
  const SessionKeys keys =
      authenticate_to_server(fd_.get(), {"store", 0}, deadline, "the rendezvous store at " + addr_);
  ch_ = SealedChannel(fd_.get(), keys, /*client=*/true);
}

// Sends one request and returns the reply payload. Caller holds mu_.
std::string TcpStore::request(const std::string& req, std::chrono::milliseconds reply_within) {
  if (!broken_.empty()) throw CommError(broken_);
  auto fail = [&](const std::string& why, bool timeout) -> std::string {
    broken_ = concat("rendezvous store at ", addr_, ": ", why);
    fd_.reset();
    if (timeout) throw CommTimeout(broken_);
    throw CommError(broken_);
  };
  std::string err;
  Writer w;
  w.buf = req;
  std::string frame = w.frame();
  IoResult res = ch_.send(frame.data(), frame.size(), Clock::now() + op_timeout_, &err);
  if (res == IoResult::kTimeout) return fail("the server stopped taking requests", true);
  if (res == IoResult::kClosed) return fail("connection lost: " + err, false);
  auto deadline = Clock::now() + reply_within;
  char len_buf[4];
  res = ch_.recv(len_buf, 4, deadline, &err);
  uint32_t len = static_cast<uint32_t>(load_le(len_buf, 4));
  if (res == IoResult::kOk && len > kMaxFrame) return fail("corrupt reply", false);
  std::string payload(res == IoResult::kOk ? len : 0, '\0');
  if (res == IoResult::kOk) res = ch_.recv(payload.data(), len, deadline, &err);
  if (res == IoResult::kTimeout) return fail("the server stopped answering", true);
  if (res == IoResult::kClosed) return fail("connection lost: " + err, false);
  return payload;
}

// A get or wait: the server answers when the keys exist or says which are missing.
std::string TcpStore::wait_reply(const std::string& req, const std::vector<std::string>& keys,
                                 std::chrono::milliseconds timeout) {
  std::string payload = request(req, timeout + op_timeout_);
  Reader r{payload};
  uint8_t status = r.u8();
  if (status == kTimedOut) {
    std::vector<std::string> missing;
    for (uint32_t n = r.u32(); n > 0; --n) missing.push_back(r.str());
    throw CommTimeout(
        concat("rendezvous store: timed out after ", timeout.count(),
               " ms waiting for key(s): ", join_keys(missing.empty() ? keys : missing)));
  }
  KEEL_CHECK(status == kOk, "tcp store: unexpected reply status ", int(status));
  return payload.substr(1);
}

void TcpStore::set(const std::string& key, const std::string& value) {
  Writer w;
  w.u8(kSet);
  w.str(key);
  w.str(value);
  std::lock_guard lock(mu_);
  std::string payload = request(w.buf, op_timeout_);
  KEEL_CHECK(!payload.empty() && payload[0] == kOk, "tcp store: set '", key, "' failed");
}

std::string TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  Writer w;
  w.u8(kGet);
  w.u64(static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)));
  w.u32(1);
  w.str(key);
  std::lock_guard lock(mu_);
  std::string rest = wait_reply(w.buf, {key}, timeout);
  Reader r{rest};
  return r.str();
}

std::optional<std::string> TcpStore::try_get(const std::string& key) {
  Writer w;
  w.u8(kTryGet);
  w.str(key);
  std::lock_guard lock(mu_);
  std::string payload = request(w.buf, op_timeout_);
  Reader r{payload};
  KEEL_CHECK(r.u8() == kOk, "tcp store: try_get '", key, "' failed");
  if (r.u8() == 0) return std::nullopt;
  return r.str();
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  Writer w;
  w.u8(kWait);
  w.u64(static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)));
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  std::lock_guard lock(mu_);
  wait_reply(w.buf, keys, timeout);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Writer w;
  w.u8(kAdd);
  w.str(key);
  w.u64(static_cast<uint64_t>(delta));
  std::lock_guard lock(mu_);
  std::string payload = request(w.buf, op_timeout_);
  Reader r{payload};
  uint8_t status = r.u8();
  if (status == kFailed) throw Error("rendezvous store: " + r.str());
  KEEL_CHECK(status == kOk, "tcp store: unexpected reply status ", int(status));
  return static_cast<int64_t>(r.u64());
}

void TcpStore::erase(const std::vector<std::string>& keys,
                     const std::vector<std::string>& prefixes) {
  Writer w;
  w.u8(kErase);
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  w.u32(static_cast<uint32_t>(prefixes.size()));
  for (const auto& p : prefixes) w.str(p);
  std::lock_guard lock(mu_);
  std::string payload = request(w.buf, op_timeout_);
  KEEL_CHECK(!payload.empty() && payload[0] == kOk, "tcp store: erase failed");
}

}  // namespace keel
