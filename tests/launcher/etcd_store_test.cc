// EtcdStore (launcher/etcd/etcd_store.h) against real 3-member clusters: TcpStore's semantics
// (blocking get, timeouts naming keys, atomic add, erase), its address form, and the faults
// it exists for: a member killed, a quorum lost.
#include "launcher/etcd/etcd_store.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <thread>
#include <vector>

#include "etcd_test_cluster.h"
#include "test_expect.h"

namespace keel {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

milliseconds since(steady_clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
}

// The tests that leave the cluster whole share one, each under a prefix of its own: a
// cluster takes a second or more to start.
class EtcdStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = new test::EtcdTestCluster(3, "etcd-store"); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  EtcdStore make(const std::string& name) {
    return EtcdStore(cluster_->endpoints(), "/keel/test/" + name + "/");
  }
  static test::EtcdTestCluster* cluster_;
};
test::EtcdTestCluster* EtcdStoreTest::cluster_ = nullptr;

TEST_F(EtcdStoreTest, SetGetTryGetEraseAndPrefixStore) {
  auto store = std::make_shared<EtcdStore>(cluster_->endpoints(), "/keel/test/basic/");
  EXPECT_FALSE(store->try_get("a").has_value());
  store->set("a", std::string("\0\1bytes", 7));
  EXPECT_EQ(store->get("a", seconds(5)), std::string("\0\1bytes", 7));
  EXPECT_EQ(store->get("a", milliseconds(0)), std::string("\0\1bytes", 7));  // exists: no wait
  store->set("a", "again");
  EXPECT_EQ(store->try_get("a").value_or(""), "again");
  // Keys live under the prefix, and nowhere else.
  EXPECT_FALSE(make("basic2").try_get("a").has_value());

  store->set("ep/1/x", "1");
  store->set("ep/1/y", "2");
  store->set("ep/2/x", "3");
  store->set("b", "4");
  store->erase({"a", "absent"}, {"ep/1/"});
  EXPECT_FALSE(store->try_get("a"));
  EXPECT_FALSE(store->try_get("ep/1/x"));
  EXPECT_FALSE(store->try_get("ep/1/y"));
  EXPECT_EQ(store->try_get("ep/2/x").value_or(""), "3");
  EXPECT_EQ(store->try_get("b").value_or(""), "4");

  PrefixStore ps("3/tp/", store);
  ps.set("addr/0", "h:1");
  EXPECT_EQ(store->try_get("3/tp/addr/0").value_or(""), "h:1");
  EXPECT_EQ(ps.get("addr/0", seconds(5)), "h:1");
  EXPECT_EQ(ps.add("n", 2), 2);
  ps.wait({"addr/0", "n"}, seconds(5));
  ps.erase({}, {""});
  EXPECT_FALSE(store->try_get("3/tp/n"));
  EXPECT_EQ(store->try_get("b").value_or(""), "4");  // outside the PrefixStore's prefix
}

// The controller's read of an epoch's acks: every key under a prefix, with its value, in key
// order, in one call; through a PrefixStore, keys relative to it.
TEST_F(EtcdStoreTest, PrefixReadListsEveryKeyUnderIt) {
  auto store = std::make_shared<EtcdStore>(cluster_->endpoints(), "/keel/test/prefix-read/");
  store->set("ack/3/1", "one");
  store->set("ack/3/0", std::string("\0zero", 5));
  store->set("ack/30/0", "another epoch");  // shares the text "ack/3", not the prefix
  store->set("ack/4/0", "later");
  store->add("ack/3/count", 2);  // a counter lists as itself, not with its writer's token
  const auto all = store->try_get_prefix("ack/3/");
  ASSERT_TRUE(all.has_value());
  const Store::KeyValues want = {
      {"ack/3/0", std::string("\0zero", 5)}, {"ack/3/1", "one"}, {"ack/3/count", "2"}};
  EXPECT_EQ(*all, want);
  EXPECT_TRUE(store->try_get_prefix("nothing/")->empty());
  PrefixStore ps("ack/", store);
  const auto rel = ps.try_get_prefix("4/");
  ASSERT_TRUE(rel.has_value());
  EXPECT_EQ(*rel, (Store::KeyValues{{"4/0", "later"}}));
}

TEST_F(EtcdStoreTest, GetBlocksUntilAnotherThreadSets) {
  EtcdStore store = make("blocking");
  // Rounds of: the getter announces its get, the main thread lets a round trip pass (the
  // getter's first read, which finds nothing) and sets. Most rounds the value comes through
  // the watch, some through a read; both must hand it over, none may miss it.
  constexpr int kRounds = 10;
  std::atomic<int> asking{-1};
  std::vector<std::string> got(kRounds);
  std::thread getter([&] {
    for (int i = 0; i < kRounds; ++i) {
      asking = i;
      got[i] = store.get("addr/" + std::to_string(i), seconds(30));
    }
    asking = kRounds;
    store.wait({"last/a", "last/b"}, seconds(30));
  });
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_TRUE(test::eventually([&] { return asking.load() == i; }));
    store.try_get("other");
    store.set("addr/" + std::to_string(i), "10.0.0.1:" + std::to_string(i));
  }
  ASSERT_TRUE(test::eventually([&] { return asking.load() == kRounds; }));
  store.try_get("other");
  store.set("last/a", "x");
  store.set("last/b", "y");
  getter.join();
  for (int i = 0; i < kRounds; ++i) EXPECT_EQ(got[i], "10.0.0.1:" + std::to_string(i));
}

TEST_F(EtcdStoreTest, TimeoutsNameTheMissingKeys) {
  EtcdStore store = make("timeouts");
  store.set("here", "1");
  auto start = steady_clock::now();
  try {
    store.get("nobody/sets/this", milliseconds(300));
    ADD_FAILURE() << "get of an absent key returned";
  } catch (const CommTimeout& e) {
    EXPECT_HAS(e.what(), "nobody/sets/this");
    EXPECT_EQ(std::string(e.what()).find("unavailable"), std::string::npos) << e.what();
  }
  EXPECT_GE(since(start), milliseconds(300));
  EXPECT_LT(since(start), milliseconds(300 + 1000));
  try {
    store.wait({"here", "missing1", "missing2"}, milliseconds(200));
    ADD_FAILURE() << "wait for absent keys returned";
  } catch (const CommTimeout& e) {
    EXPECT_HAS(e.what(), "missing1, missing2");
    EXPECT_EQ(std::string(e.what()).find("here"), std::string::npos) << e.what();
  }
}

TEST_F(EtcdStoreTest, ConcurrentAddsSumExactly) {
  EtcdStore store = make("add");
  constexpr int kThreads = 4, kAdds = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) store.add("count", 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(store.get("count", seconds(5)), std::to_string(kThreads * kAdds));  // decimal text
  EXPECT_EQ(store.add("count", -100), 0);
  EXPECT_EQ(store.add("fresh", -7), -7);
  store.set("text", "abc");
  try {
    store.add("text", 1);
    ADD_FAILURE() << "add to a non-integer succeeded";
  } catch (const CommError& e) {
    ADD_FAILURE() << "a bad value is no communication failure: " << e.what();
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "'text'");
  }
}

TEST_F(EtcdStoreTest, AddressRoundTrips) {
  const std::string addr = etcd_store_address(cluster_->endpoints(), "/keel/test/addr/");
  EXPECT_TRUE(is_etcd_store_address(addr));
  EXPECT_FALSE(is_etcd_store_address("127.0.0.1:2379"));
  // Members keel started take TLS: "etcds://", the endpoints without their "https://".
  auto bare = [&](int i) { return cluster_->endpoints()[size_t(i)].substr(8); };
  EXPECT_EQ(addr, "etcds://" + bare(0) + "," + bare(1) + "," + bare(2) + "/keel/test/addr/");
  std::shared_ptr<Store> store = connect_etcd_store(addr);
  store->set("k", "v");
  EXPECT_EQ(make("addr").try_get("k").value_or(""), "v");
  for (const char* bad : {"etcd://127.0.0.1:1", "etcd:///p/", "etcd://127.0.0.1:1,/p/",
                          "etcd://nohost/p/", "tcp://127.0.0.1:1/p/"})
    EXPECT_HAS(test::input_error_of([&] { connect_etcd_store(bad); }), bad);
  test::input_error_of([&] { etcd_store_address({"127.0.0.1:1"}, "no-slash/"); });
  test::input_error_of([&] { etcd_store_address({}, "/p/"); });
}

TEST(EtcdStore, MemberKilledGetsAndSetsGoOn) {
  test::EtcdTestCluster cluster(3, "etcd-store-kill");
  EtcdStore store(cluster.endpoints(), "/keel/test/kill/");
  store.set("before", "1");
  // A get already waiting on the watch (served by member 0, the channel's first): the watch
  // must move to another member and still deliver the set that follows the kill.
  std::atomic<bool> waiting{false};
  std::string got;
  std::thread getter([&] {
    waiting = true;
    got = store.get("after", seconds(30));
  });
  ASSERT_TRUE(test::eventually([&] { return waiting.load(); }));
  ASSERT_EQ(::kill(cluster.member(0).pid(), SIGKILL), 0);
  const auto start = steady_clock::now();
  store.set("after", "2");
  std::printf("first set after kill -9 of a member: %lld ms\n", (long long)since(start).count());
  getter.join();
  EXPECT_EQ(got, "2");
  for (int i = 0; i < 5; ++i) {
    store.set("k" + std::to_string(i), std::to_string(i));
    EXPECT_EQ(store.get("k" + std::to_string(i), seconds(5)), std::to_string(i));
    EXPECT_EQ(store.add("n", 1), i + 1);
  }
  EXPECT_EQ(store.try_get("before").value_or(""), "1");
}

TEST(EtcdStore, QuorumLostThrowsCommErrorWithinTimeout) {
  test::EtcdTestCluster cluster(3, "etcd-store-quorum");
  const milliseconds call_timeout(1000);
  auto owned = std::make_unique<EtcdStore>(cluster.endpoints(), "/keel/test/quorum/", call_timeout);
  EtcdStore& store = *owned;
  store.set("k", "v");
  EXPECT_THROW(store.get("absent", milliseconds(50)), CommTimeout);  // opens the watch
  const pid_t a = cluster.member(1).pid(), b = cluster.member(2).pid();
  ASSERT_EQ(::kill(a, SIGSTOP), 0);
  ASSERT_EQ(::kill(b, SIGSTOP), 0);
  auto start = steady_clock::now();
  try {
    store.set("k", "without quorum");
    ADD_FAILURE() << "a set without quorum succeeded";
  } catch (const CommError& e) {
    EXPECT_HAS(e.what(), "etcd unavailable");
    EXPECT_HAS(e.what(), "set k");
  }
  EXPECT_LT(since(start), call_timeout + milliseconds(500));
  // A wait: covered by the watch, its last read at the deadline finds etcd gone.
  start = steady_clock::now();
  try {
    store.get("absent", milliseconds(300));
    ADD_FAILURE() << "a get without quorum returned";
  } catch (const CommTimeout& e) {
    EXPECT_HAS(e.what(), "absent");
    EXPECT_HAS(e.what(), "etcd unavailable");
  }
  EXPECT_LT(since(start), milliseconds(300 + 250 + 500));
  start = steady_clock::now();
  EXPECT_THROW(store.add("n", 1), CommError);
  EXPECT_LT(since(start), call_timeout + milliseconds(500));
  // Its watch, cut off from a leader, still ends at once.
  start = steady_clock::now();
  owned.reset();
  EXPECT_LT(since(start), milliseconds(500));
  ASSERT_EQ(::kill(a, SIGCONT), 0);
  ASSERT_EQ(::kill(b, SIGCONT), 0);
}

}  // namespace
}  // namespace keel
