// The job-key handshake (parallel/peer_auth.h) and the TCP servers that start with it, attacked
// with what an intruder has: an address, random bytes, a huge length, its own key, and a
// handshake captured from a real connection and replayed.
#include "parallel/peer_auth.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "parallel/job_key.h"
#include "parallel/socket_util.h"
#include "parallel/tcp_store.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using detail::Clock;
using detail::Fd;

const std::string kHost = "127.0.0.1";

Fd raw_connect(int port) {
  return detail::connect_tcp(kHost, port, Clock::now() + 5s, "test server");
}

// Sends `bytes` and reports whether the server closed the connection within 5 s, having
// answered nothing but a handshake's challenge (at most 64 bytes).
bool closed_by_server(int port, const std::string& bytes, size_t* answered = nullptr) {
  Fd fd = raw_connect(port);
  std::string err;
  detail::send_all(fd.get(), bytes.data(), bytes.size(), Clock::now() + 5s, &err);
  size_t got = 0;
  char buf[4096];
  const auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      if (answered) *answered = got;
      return true;
    }
    if (n > 0) got += size_t(n);
    std::this_thread::sleep_for(5ms);
  }
  if (answered) *answered = got;
  return false;
}

// Sends `bytes` on the connected `fd` and reports whether the server closed it within 5 s.
bool closed_by_server_after(int fd, const std::string& bytes) {
  std::string err;
  detail::send_all(fd, bytes.data(), bytes.size(), Clock::now() + 5s, &err);
  char buf[4096];
  const auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

TEST(PeerAuth, SameKeyPassesOtherKeyPurposeOrEpochIsRefused) {
  const JobKey job = JobKey::generate(), other = JobKey::generate();
  struct Case {
    JobKey client_key;
    AuthChannel client, server;
    bool ok;
  } cases[] = {{job, {"store", 0}, {"store", 0}, true},
               {other, {"store", 0}, {"store", 0}, false},
               {job, {"backup", 0}, {"store", 0}, false},
               {job, {"comm 3/tp", 0}, {"comm 4/tp", 0}, false},
               {job, {"store", 1}, {"store", 2}, false}};
  for (const Case& c : cases) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    Fd a(sv[0]), b(sv[1]);
    std::string server_error;
    std::thread server([&] {
      try {
        authenticate_client(b.get(), c.server, Clock::now() + 5s, "server", job);
      } catch (const AuthError& e) {
        server_error = e.what();
      }
    });
    bool client_ok = true;
    try {
      authenticate_to_server(a.get(), c.client, Clock::now() + 5s, "client", c.client_key);
    } catch (const AuthError&) {
      client_ok = false;
      a.reset();  // the server would otherwise wait for a proof that never comes
    }
    server.join();
    EXPECT_EQ(client_ok, c.ok) << c.client.purpose << " -> " << c.server.purpose;
    EXPECT_EQ(server_error.empty(), c.ok) << server_error;
  }
}

TEST(PeerAuth, KeyFileIsPrivateAndRoundTrips) {
  const std::string dir = ::testing::TempDir() + "keel-key-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/secret";
  const JobKey k = JobKey::generate();
  k.save(path);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(JobKey::load(path) == k);
  ::chmod(path.c_str(), 0644);
  try {
    JobKey::load(path);
    ADD_FAILURE() << "a key file others can read was taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("mode 644"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find(k.hex()), std::string::npos) << "the key in a message";
  }
  std::ofstream(path) << "not a key";
  ::chmod(path.c_str(), 0600);
  EXPECT_THROW(JobKey::load(path), InputError);
  std::filesystem::remove_all(dir);
}

// A secret planted where keel reads it: a link to a file the intruder controls, or (with the
// right to give files away, as root here) a file owned by another user: both refused by name;
// and saving over a planted link replaces the link, never writes through it.
TEST(PeerAuth, APlantedSecretIsRefusedAndSavingNeverWritesThroughALink) {
  const std::string dir = ::testing::TempDir() + "keel-key-planted-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string theirs = dir + "/theirs", path = dir + "/secret";
  const JobKey k = JobKey::generate();
  k.save(theirs);
  std::filesystem::create_symlink(theirs, path);
  try {
    JobKey::load(path);
    ADD_FAILURE() << "a secret read through a link";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a link"), std::string::npos) << e.what();
  }
  const JobKey mine = JobKey::generate();
  mine.save(path);
  EXPECT_FALSE(std::filesystem::is_symlink(path));
  EXPECT_TRUE(JobKey::load(theirs) == k) << "the link's target was written";
  EXPECT_TRUE(JobKey::load(path) == mine);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    try {
      JobKey::load(path);
      ADD_FAILURE() << "another user's secret was taken";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("owned by uid 65534"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

// The rendezvous store: intruders are closed and counted, a client of another job is refused
// with a clear error, and the job's own client is served throughout.
TEST(PeerAuth, StoreRefusesIntrudersAndServesTheJob) {
  TcpStoreServer server(kHost, 0);
  TcpStore store(kHost, server.port());
  store.set("weights", "job data");
  const int64_t refused0 = auth_refusals();

  std::mt19937 rng(7);
  std::string random_bytes(65536, '\0');
  for (char& c : random_bytes) c = char(rng());
  size_t answered = 0;
  EXPECT_TRUE(closed_by_server(server.port(), random_bytes, &answered));
  EXPECT_EQ(answered, 0u) << "random bytes got an answer";
  // A store request with a 4 GiB length, as a client of the old protocol would send it.
  EXPECT_TRUE(closed_by_server(server.port(), std::string("\xff\xff\xff\xff", 4) + "GET"));
  // A valid hello and then garbage for the proof: the challenge (64 bytes), nothing more.
  std::string hello = "KEELHS01" + std::string(32, 'n');
  EXPECT_TRUE(closed_by_server(server.port(), hello + std::string(32, 'x'), &answered));
  EXPECT_EQ(answered, 64u);
  EXPECT_GE(auth_refusals() - refused0, 3);

  // Another job's key: refused before any request, with an error that says so.
  try {
    Fd fd = raw_connect(server.port());
    authenticate_to_server(fd.get(), {"store", 0}, Clock::now() + 5s, "intruder",
                           JobKey::generate());
    ADD_FAILURE() << "another job's key was accepted";
  } catch (const AuthError& e) {
    EXPECT_NE(std::string(e.what()).find("does not hold this job's key"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(store.get("weights", 1s), "job data");
  TcpStore again(kHost, server.port());
  EXPECT_EQ(again.get("weights", 1s), "job data");
}

// A peer that holds the job's key (a buggy or compromised rank) asks the store to erase 0 keys
// and then 2^32 - 1 prefixes, in a message of a few bytes: that connection is dropped, before
// anything is allocated for the count (128 GiB: the bad_alloc ended the store's thread, and
// with it the job), and the job's own client is served throughout.
TEST(PeerAuth, AKeyedPeersImpossibleCountDropsOnlyItsConnection) {
  TcpStoreServer server(kHost, 0);
  TcpStore store(kHost, server.port());
  store.set("weights", "job data");
  Fd fd = raw_connect(server.port());
  authenticate_to_server(fd.get(), {"store", 0}, Clock::now() + 5s, "a keyed peer");
  // A frame: its length, then the erase op, 0 keys, 2^32 - 1 prefixes.
  const std::string payload = std::string("\x05", 1) + std::string(4, '\0') + "\xff\xff\xff\xff";
  std::string frame(4, '\0');
  frame[0] = char(payload.size());
  EXPECT_TRUE(closed_by_server_after(fd.get(), frame + payload));
  EXPECT_EQ(store.get("weights", 1s), "job data");
  TcpStore again(kHost, server.port());
  EXPECT_EQ(again.get("weights", 1s), "job data");
}

// A handshake captured from a real connection and replayed byte for byte: the server's fresh
// nonce makes the captured proof worthless.
TEST(PeerAuth, ReplayedHandshakeIsRefused) {
  TcpStoreServer server(kHost, 0);
  // Capture: a relay between a real client and the server records what the client sends.
  const Fd relay_listen = detail::listen_tcp(kHost, 0, 4);
  const int relay_port = detail::local_port(relay_listen.get());
  std::string captured;
  std::thread relay([&] {
    pollfd p{relay_listen.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
    Fd in(::accept4(relay_listen.get(), nullptr, nullptr, SOCK_NONBLOCK));
    Fd out = raw_connect(server.port());
    std::string err;
    char hello[40], challenge[64], proof[32], ok[1];
    auto deadline = Clock::now() + 5s;
    ASSERT_EQ(detail::recv_all(in.get(), hello, 40, deadline, &err), detail::IoResult::kOk);
    detail::send_all(out.get(), hello, 40, deadline, &err);
    ASSERT_EQ(detail::recv_all(out.get(), challenge, 64, deadline, &err), detail::IoResult::kOk);
    detail::send_all(in.get(), challenge, 64, deadline, &err);
    ASSERT_EQ(detail::recv_all(in.get(), proof, 32, deadline, &err), detail::IoResult::kOk);
    detail::send_all(out.get(), proof, 32, deadline, &err);
    ASSERT_EQ(detail::recv_all(out.get(), ok, 1, deadline, &err), detail::IoResult::kOk);
    detail::send_all(in.get(), ok, 1, deadline, &err);
    captured = std::string(hello, 40) + std::string(proof, 32);
  });
  TcpStore client(kHost, relay_port);  // a real, successful handshake through the relay
  relay.join();
  ASSERT_EQ(captured.size(), 72u);
  const int64_t refused0 = auth_refusals();
  size_t answered = 0;
  EXPECT_TRUE(closed_by_server(server.port(), captured, &answered));
  EXPECT_EQ(answered, 64u) << "only the fresh challenge, never an acceptance";
  EXPECT_EQ(auth_refusals() - refused0, 1);
}

// Connections that open and say nothing do not hold the server up for the job's own.
TEST(PeerAuth, SilentConnectionsDoNotStallTheStore) {
  TcpStoreServer server(kHost, 0);
  std::vector<Fd> silent;
  for (int i = 0; i < 300; ++i) silent.push_back(raw_connect(server.port()));
  TcpStore store(kHost, server.port(), 5s);
  store.set("k", "v");
  EXPECT_EQ(store.get("k", 1s), "v");
}

}  // namespace
}  // namespace keel
