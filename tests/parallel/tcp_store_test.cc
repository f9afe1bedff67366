// TcpStoreServer and TcpStore: the operations, blocking and timeouts, concurrency, a server
// that starts late, and one that dies or stops under a waiting client.
#include "parallel/tcp_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "parallel/hash_store.h"
#include "runtime/check.h"
#include "tests/parallel/rank_procs.h"

namespace keel {
namespace {

using namespace std::chrono_literals;

const std::string kHost = "127.0.0.1";

// A port nobody listens on right now.
int free_port() {
  TcpStoreServer s(kHost, 0);
  return s.port();
}

TEST(TcpStore, SetGetWaitAdd) {
  TcpStoreServer server;
  TcpStore store(kHost, server.port());
  store.set("a", "1");
  EXPECT_EQ(store.get("a", 1s), "1");
  store.set("a", "two");  // overwrite
  EXPECT_EQ(store.get("a", 1s), "two");
  std::string binary("x\0y\xff", 4);
  store.set("bin", binary);
  EXPECT_EQ(store.get("bin", 1s), binary);
  store.wait({"a", "bin"}, 1s);
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -7), -2);
  EXPECT_EQ(store.get("n", 1s), "-2");
  // An empty key and value are fine too.
  store.set("", "");
  EXPECT_EQ(store.get("", 1s), "");
}

// An epoch's keys go, by name and by prefix; a key that only shares the digits stays.
void expect_erase_by_key_and_prefix(Store& store) {
  for (const char* k : {"abort/3", "abort/30", "3/tp/0/addr/1", "3/dp/0/addr/0", "30/tp/0/addr/1",
                        "ack/3/0", "ack/30/0", "restored/3/0"})
    store.set(k, "v");
  store.erase({"abort/3", "never-set"}, {"3/", "ack/3/"});
  for (const char* gone : {"abort/3", "3/tp/0/addr/1", "3/dp/0/addr/0", "ack/3/0"})
    EXPECT_THROW(store.get(gone, 10ms), CommTimeout) << gone;
  for (const char* kept : {"abort/30", "30/tp/0/addr/1", "ack/30/0", "restored/3/0"})
    EXPECT_EQ(store.get(kept, 1s), "v") << kept;
}

TEST(TcpStore, EraseRemovesKeysAndPrefixes) {
  TcpStoreServer server;
  TcpStore store(kHost, server.port());
  expect_erase_by_key_and_prefix(store);
  // Through a PrefixStore, the prefix applies to what it erases too.
  auto inner = std::make_shared<TcpStore>(kHost, server.port());
  PrefixStore scoped("job/", inner);
  store.set("job/4/x", "v");
  store.set("4/x", "v");
  scoped.erase({}, {"4/"});
  EXPECT_THROW(store.get("job/4/x", 10ms), CommTimeout);
  EXPECT_EQ(store.get("4/x", 1s), "v");
}

TEST(HashStore, EraseRemovesKeysAndPrefixes) {
  HashStore store;
  expect_erase_by_key_and_prefix(store);
}

// try_get answers at once: the value, or nothing for a key that is not there (also an empty
// value is a value), through a PrefixStore with its prefix, and it never waits for a set.
void expect_try_get(Store& store) {
  EXPECT_EQ(store.try_get("absent"), std::nullopt);
  store.set("k", "v");
  EXPECT_EQ(store.try_get("k"), std::optional<std::string>("v"));
  store.set("empty", "");
  EXPECT_EQ(store.try_get("empty"), std::optional<std::string>(""));
  store.add("count", 3);
  EXPECT_EQ(store.try_get("count"), std::optional<std::string>("3"));
  store.erase({"k"}, {});
  EXPECT_EQ(store.try_get("k"), std::nullopt);
}

TEST(TcpStore, TryGetTellsWhetherAKeyIsThere) {
  TcpStoreServer server;
  auto store = std::make_shared<TcpStore>(kHost, server.port());
  expect_try_get(*store);
  PrefixStore scoped("job/", store);
  expect_try_get(scoped);
  EXPECT_EQ(store->try_get("job/empty"), std::optional<std::string>(""));
  // The connection is still good for a blocking call after many answers at once.
  store->set("later", "x");
  EXPECT_EQ(store->get("later", 1s), "x");
}

TEST(HashStore, PrefixReadListsEveryKeyUnderItAndTcpStoreCannot) {
  auto store = std::make_shared<HashStore>();
  store->set("ack/3/1", "one");
  store->set("ack/3/0", "zero");
  store->set("ack/30/0", "another epoch");
  const auto all = store->try_get_prefix("ack/3/");
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(*all, (Store::KeyValues{{"ack/3/0", "zero"}, {"ack/3/1", "one"}}));
  PrefixStore ps("ack/", store);
  EXPECT_EQ(ps.try_get_prefix("30/").value_or(Store::KeyValues{}),
            (Store::KeyValues{{"30/0", "another epoch"}}));
  // A TCP store lists nothing: its callers read the keys they expect one by one.
  TcpStoreServer server;
  TcpStore tcp(kHost, server.port());
  tcp.set("ack/3/0", "zero");
  EXPECT_FALSE(tcp.try_get_prefix("ack/3/").has_value());
}

TEST(HashStore, TryGetTellsWhetherAKeyIsThere) {
  HashStore store;
  expect_try_get(store);
}

TEST(TcpStore, AddToNonIntegerFailsAndKeepsTheConnection) {
  TcpStoreServer server;
  TcpStore store(kHost, server.port());
  store.set("s", "abc");
  EXPECT_THROW(store.add("s", 1), Error);
  EXPECT_EQ(store.get("s", 1s), "abc");
}

TEST(TcpStore, GetAndWaitAreAnsweredWhenAnotherClientSets) {
  TcpStoreServer server;
  TcpStore waiter(kHost, server.port());
  // Each key is set once the waiter is blocked in the call that waits for it.
  const pid_t waiter_tid = test::this_thread_id();
  std::atomic<bool> got_late{false};
  std::thread setter([&] {
    TcpStore other(kHost, server.port());
    EXPECT_TRUE(test::wait_until_blocked(waiter_tid)) << "get never blocked";
    other.set("late", "v");
    while (!got_late) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(test::wait_until_blocked(waiter_tid)) << "wait never blocked";
    other.add("late2", 3);
  });
  EXPECT_EQ(waiter.get("late", 20s), "v");
  got_late = true;
  waiter.wait({"late", "late2"}, 20s);
  EXPECT_EQ(waiter.get("late2", 1s), "3");
  setter.join();
}

TEST(TcpStore, TimeoutsNameTheMissingKeys) {
  TcpStoreServer server;
  TcpStore store(kHost, server.port());
  store.set("present", "x");
  try {
    store.get("absent-key", 100ms);
    FAIL() << "get of a missing key returned";
  } catch (const CommTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("absent-key"), std::string::npos) << e.what();
  }
  try {
    store.wait({"present", "gone-1", "gone-2"}, 100ms);
    FAIL() << "wait for missing keys returned";
  } catch (const CommTimeout& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("gone-1"), std::string::npos) << what;
    EXPECT_NE(what.find("gone-2"), std::string::npos) << what;
    EXPECT_EQ(what.find("present"), std::string::npos) << what;
  }
  // A timeout is an answer, not a broken connection.
  EXPECT_EQ(store.get("present", 1s), "x");
}

TEST(TcpStore, ConcurrentAddsFromManyClientsAndThreads) {
  TcpStoreServer server;
  TcpStore shared(kHost, server.port());
  constexpr int kThreads = 4, kAdds = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      TcpStore own(kHost, server.port());
      for (int i = 0; i < kAdds; ++i) {
        own.add("counter", 1);
        shared.add("counter", 2);  // one client from several threads
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(shared.add("counter", 0), kThreads * kAdds * 3);
}

TEST(TcpStore, ClientWaitsForAServerThatStartsLater) {
  int port = free_port();
  std::unique_ptr<TcpStoreServer> server;
  // The server starts once the client is retrying (asleep between refused connects).
  const pid_t client_tid = test::this_thread_id();
  std::thread starter([&] {
    EXPECT_TRUE(test::wait_until_blocked(client_tid)) << "the client never waited";
    server = std::make_unique<TcpStoreServer>(kHost, port);
  });
  TcpStore store(kHost, port, 20s);
  starter.join();
  store.set("k", "v");
  EXPECT_EQ(store.get("k", 1s), "v");
}

TEST(TcpStore, ConnectTimesOutWithoutAServer) {
  int port = free_port();
  EXPECT_THROW(TcpStore(kHost, port, 100ms), CommTimeout);
}

TEST(TcpStore, StoppedServerFailsABlockedGetWithCommError) {
  TcpStoreServer server;
  TcpStore store(kHost, server.port());
  // Stops the server once the get is blocked waiting for its answer.
  const pid_t getter_tid = test::this_thread_id();
  std::thread stopper([&] {
    EXPECT_TRUE(test::wait_until_blocked(getter_tid)) << "the get never blocked";
    server.stop();
  });
  try {
    store.get("never", 20s);
    ADD_FAILURE() << "get returned after the server stopped";
  } catch (const CommTimeout& e) {
    ADD_FAILURE() << "a stopped server must not read as a timeout: " << e.what();
  } catch (const CommError&) {
  }
  stopper.join();
  EXPECT_THROW(store.set("a", "b"), CommError);  // the client stays broken
}

TEST(TcpStore, KilledServerProcessGivesCommError) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    TcpStoreServer server(kHost, 0);
    int port = server.port();
    [[maybe_unused]] ssize_t n = ::write(fds[1], &port, sizeof(port));
    for (;;) ::pause();
  }
  int port = 0;
  ASSERT_EQ(::read(fds[0], &port, sizeof(port)), ssize_t(sizeof(port)));
  ::close(fds[0]);
  ::close(fds[1]);
  TcpStore store(kHost, port);
  store.set("k", "v");
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_THROW(store.get("other", 20s), CommError);
}

TEST(TcpStore, ParseHostPort) {
  EXPECT_EQ(parse_host_port("127.0.0.1:29500"), (std::pair<std::string, int>{"127.0.0.1", 29500}));
  EXPECT_EQ(parse_host_port("node-3.cluster:0"),
            (std::pair<std::string, int>{"node-3.cluster", 0}));
  EXPECT_EQ(parse_host_port("[::1]:80"), (std::pair<std::string, int>{"::1", 80}));
  for (const char* bad : {"", "host", "host:", ":80", "host:80x", "host:-1", "host:65536", "::1:80",
                          "[]:80", "host: 80"}) {
    EXPECT_THROW(parse_host_port(bad), InputError) << bad;
  }
}

}  // namespace
}  // namespace keel
