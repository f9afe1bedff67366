// The sealed channel (parallel/sealed_channel.h): what crosses machines after the handshake,
// attacked on the wire by an intruder on the path: it reads, alters, replays, reorders and
// splices records of another connection. Each is refused, counted and logged; a payload
// never shows on the wire. (A backup through such a relay: tests/ckpt/backup_sealed_test.cc.)
#include "parallel/sealed_channel.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "parallel/job_key.h"
#include "parallel/peer_auth.h"
#include "parallel/socket_util.h"
#include "parallel/tcp_store.h"
#include "tests/parallel/wire_tap.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using detail::Clock;
using detail::Fd;
using detail::IoResult;

struct Pair {
  Fd a, b;
};
Pair unix_pair() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  return {Fd(sv[0]), Fd(sv[1])};
}

SessionKeys random_keys() {
  SessionKeys k;
  const JobKey a = JobKey::generate(), b = JobKey::generate();
  k.to_server = a.bytes();
  k.to_client = b.bytes();
  return k;
}

// A loopback TCP connection: {client end, server end}.
Pair tcp_pair() {
  Fd listener = detail::listen_tcp("127.0.0.1", 0, 4);
  Fd c = detail::connect_tcp("127.0.0.1", detail::local_port(listener.get()), Clock::now() + 5s,
                             "test listener");
  int s = -1;
  const auto deadline = Clock::now() + 5s;
  while (s < 0 && Clock::now() < deadline) {
    s = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s < 0) std::this_thread::sleep_for(1ms);
  }
  EXPECT_GE(s, 0);
  return {std::move(c), Fd(s)};
}

using test::drain;
using test::pattern;

TEST(SealedChannel, OneMachineIsLeftPlainUnlessThePolicySaysAlways) {
  Pair t = tcp_pair();
  EXPECT_TRUE(same_machine(t.a.get()));
  EXPECT_TRUE(same_machine(t.b.get()));
  EXPECT_FALSE(seals(t.a.get(), SealPolicy::kBetweenMachines));
  EXPECT_TRUE(seals(t.a.get(), SealPolicy::kAlways));
  EXPECT_FALSE(seals(t.a.get(), SealPolicy::kNever));
  const SessionKeys k = random_keys();
  EXPECT_FALSE(SealedChannel(t.a.get(), k, true, SealPolicy::kBetweenMachines).sealed());
  EXPECT_TRUE(SealedChannel(t.a.get(), k, true, SealPolicy::kAlways).sealed());
}

// Sends `msgs` through a sealed channel into `wire`, returns what was written there.
std::string seal_into(const SessionKeys& k, const std::vector<std::string>& msgs) {
  Pair p = unix_pair();
  SealedChannel tx(p.a.get(), k, /*client=*/true, SealPolicy::kAlways);
  std::string wire;
  std::thread reader([&] {
    // Reads until the sender closes its end.
    for (;;) {
      std::string got = drain(p.b.get());
      wire += got;
      char c;
      if (got.empty()) {
        ssize_t n = ::recv(p.b.get(), &c, 1, MSG_DONTWAIT | MSG_PEEK);
        if (n == 0) return;
        std::this_thread::sleep_for(1ms);
      }
    }
  });
  std::string err;
  for (const std::string& m : msgs)
    EXPECT_EQ(tx.send(m.data(), m.size(), Clock::now() + 5s, &err), IoResult::kOk) << err;
  ::shutdown(p.a.get(), SHUT_WR);
  reader.join();
  return wire;
}

// Feeds `wire` to a receiving channel and reads `sizes` messages; returns them, or stops at
// the first failure with its error in `err`.
std::vector<std::string> open_from(const SessionKeys& k, const std::string& wire,
                                   const std::vector<size_t>& sizes, std::string* err) {
  Pair p = unix_pair();
  SealedChannel rx(p.b.get(), k, /*client=*/false, SealPolicy::kAlways);
  std::thread writer([&] {
    std::string e;
    detail::send_all(p.a.get(), wire.data(), wire.size(), Clock::now() + 10s, &e);
  });
  std::vector<std::string> out;
  for (size_t n : sizes) {
    std::string m(n, '\0');
    if (rx.recv(m.data(), n, Clock::now() + 2s, err) != IoResult::kOk) break;
    out.push_back(m);
  }
  // The receiver has stopped reading: unblock a writer with more to send.
  ::shutdown(p.b.get(), SHUT_RDWR);
  writer.join();
  return out;
}

TEST(SealedChannel, AnySizesRoundTripAndNoPayloadByteShowsOnTheWire) {
  const SessionKeys k = random_keys();
  const std::string big = pattern(3 * SealedChannel::kMaxRecord + 12345);
  const std::vector<std::string> msgs = {"hdr", big, pattern(1), pattern(4096)};
  const std::string wire = seal_into(k, msgs);
  EXPECT_EQ(wire.find(pattern(40)), std::string::npos) << "plaintext on the wire";
  // Read back in other pieces than were sent: byte by byte across a record's edge, then the
  // rest, so records are split between reads and reads between records.
  std::string all;
  for (const auto& m : msgs) all += m;
  std::vector<size_t> sizes = {1, 1, 1, 7, all.size() - 10};
  std::string err;
  std::vector<std::string> got = open_from(k, wire, sizes, &err);
  ASSERT_EQ(got.size(), sizes.size()) << err;
  std::string joined;
  for (const auto& g : got) joined += g;
  EXPECT_EQ(joined, all);

  // The same under kNever shows the payload: the test can tell the two apart.
  Pair p = unix_pair();
  SealedChannel plain(p.a.get(), k, true, SealPolicy::kNever);
  const std::string m = pattern(1000);
  std::string e;
  ASSERT_EQ(plain.send(m.data(), m.size(), Clock::now() + 5s, &e), IoResult::kOk);
  EXPECT_NE(drain(p.b.get()).find(pattern(40)), std::string::npos);
}

TEST(SealedChannel, AlteredReplayedReorderedOrSplicedRecordsAreRefused) {
  const SessionKeys k = random_keys();
  const std::vector<std::string> msgs = {pattern(1000), pattern(2000), pattern(3000)};
  const std::string wire = seal_into(k, msgs);
  // Records: 4 bytes of length, the ciphertext, 16 bytes of tag.
  auto record = [&](const std::string& w, int i) {
    size_t off = 0;
    for (int r = 0;; ++r) {
      size_t n = 0;
      for (int b = 0; b < 4; ++b) n |= size_t(uint8_t(w[off + size_t(b)])) << (8 * b);
      if (r == i) return w.substr(off, 4 + n + 16);
      off += 4 + n + 16;
    }
  };
  const std::string r0 = record(wire, 0), r1 = record(wire, 1), r2 = record(wire, 2);
  ASSERT_EQ(r0 + r1 + r2, wire);
  std::string flipped = r1;
  flipped[100] ^= 0x01;
  std::string tag_flipped = r1;
  tag_flipped.back() ^= 0x80;
  std::string longer = r1;  // a length that claims more than the record holds
  longer[0] = char(uint8_t(longer[0]) + 1);
  const std::string other = record(seal_into(random_keys(), msgs), 1);
  struct Case {
    const char* what;
    std::string wire;
  } cases[] = {{"a ciphertext byte flipped", r0 + flipped + r2},
               {"a tag bit flipped", r0 + tag_flipped + r2},
               {"a length changed", r0 + longer + r2},
               {"a record replayed", r0 + r0 + r2},
               {"records reordered", r0 + r2 + r1},
               {"a record of another connection", r0 + other + r2},
               {"random bytes", r0 + pattern(3000)}};
  for (const Case& c : cases) {
    const int64_t refused = auth_refusals();
    std::string err;
    std::vector<std::string> got = open_from(k, c.wire, {1000, 2000, 3000}, &err);
    EXPECT_EQ(got.size(), 1u) << c.what << ": only the first record opens";
    if (!got.empty()) {
      EXPECT_EQ(got[0], msgs[0]) << c.what;
    }
    EXPECT_NE(err.find("sealed record"), std::string::npos) << c.what << ": " << err;
    EXPECT_EQ(auth_refusals(), refused + 1) << c.what;
  }
  // The untouched stream opens whole.
  std::string err;
  EXPECT_EQ(open_from(k, wire, {1000, 2000, 3000}, &err).size(), 3u) << err;
}

// The rendezvous store seals its connections the same way (its server opens records out of
// its poll loop): values of every size round-trip, a blocked get is answered.
TEST(SealedChannel, TheStoreServesSealedClients) {
  set_seal_policy(SealPolicy::kAlways);
  {
    TcpStoreServer server;
    TcpStore a("127.0.0.1", server.port()), b("127.0.0.1", server.port());
    const std::string big = pattern(3 * SealedChannel::kMaxRecord + 5);
    a.set("big", big);
    EXPECT_EQ(b.get("big", 5s), big);
    std::thread later([&] { a.set("late", "x"); });
    EXPECT_EQ(b.get("late", 5s), "x");
    later.join();
    EXPECT_EQ(a.add("n", 3), 3);
  }
  set_seal_policy(SealPolicy::kBetweenMachines);
}

}  // namespace
}  // namespace keel
