// EtcdClient (launcher/etcd/etcd_client.h) against a real 3-member cluster: keys, prefixes,
// the guarded writes that fence a controller, leases, watches, and the write counters.
#include "launcher/etcd/etcd_client.h"

#include <gtest/gtest.h>

#include <optional>

#include <atomic>
#include <mutex>
#include <vector>

#include "etcd_test_cluster.h"
#include "launcher/etcd/etcd_lease.h"
#include "launcher/etcd/etcd_watch.h"
#include "test_expect.h"

namespace keel {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(EtcdClient, PutGetPrefixDeleteAndCounters) {
  test::EtcdTestCluster cluster(3);
  EtcdClient client(cluster.endpoints());
  EXPECT_FALSE(client.get("/job/a").has_value());
  const int64_t r1 = client.put("/job/a", std::string("\0\1bytes", 7));
  const int64_t r2 = client.put("/job/b", "2");
  client.put("/jobx", "not under /job/");
  EXPECT_GT(r2, r1);
  const auto a = client.get("/job/a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->value, std::string("\0\1bytes", 7));  // bytes, not C strings
  EXPECT_EQ(a->create_revision, r1);
  EXPECT_EQ(a->mod_revision, r1);
  EXPECT_EQ(client.put("/job/a", "again"), r2 + 2);
  EXPECT_EQ(client.get("/job/a")->create_revision, r1);  // the same key, a new revision

  const auto all = client.get_prefix("/job/");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].key, "/job/a");
  EXPECT_EQ(all[1].key, "/job/b");
  EtcdRange newest;
  newest.order = EtcdRange::Order::kCreateDescending;
  newest.limit = 1;
  EXPECT_EQ(client.get_prefix("/job/", newest).at(0).key, "/job/b");

  EXPECT_EQ(client.create("/job/b", "other"), 0);  // exists: nothing written
  EXPECT_EQ(client.get("/job/b")->value, "2");
  EXPECT_GT(client.create("/job/c", "3"), 0);

  EXPECT_EQ(client.erase("/job/a"), 1);
  EXPECT_EQ(client.erase("/job/a"), 0);
  EXPECT_EQ(client.erase_prefix("/job/"), 2);
  EXPECT_TRUE(client.get_prefix("/job/").empty());
  EXPECT_TRUE(client.get("/jobx").has_value());

  // 3 puts + 1 rewrite + 2 creates + 2 deletes + 1 prefix delete.
  EXPECT_EQ(client.writes(), 9u);
  EXPECT_EQ(client.bytes_written(),
            (6u + 7) + (6 + 1) + (5 + 15) + (6 + 5) + (6 + 5) + (6 + 1) + 6 + 6 + 5);
}

// A compare-and-swap sent again after its answer was lost (call() tries a timed-out write
// on the next member) finds the key changed by its own first try: with a writer token it
// says so (true), instead of reporting a lost race that makes a counter's add count twice.
// Another writer's equal value is still a lost race.
TEST(EtcdClient, ARetriedSwapRecognisesItsOwnWrite) {
  test::EtcdTestCluster cluster(1);
  EtcdClient client(cluster.endpoints());
  client.put("/n", "4");
  const int64_t base = client.get("/n")->mod_revision;
  std::optional<EtcdKeyValue> now;
  ASSERT_TRUE(client.put_if_unchanged("/n", base, "5", &now, "token-a"));
  // The same try again (its first answer lost): applied already, by this call.
  EXPECT_TRUE(client.put_if_unchanged("/n", base, "5", &now, "token-a"));
  EXPECT_EQ(client.get("/n")->value, "5");
  // Another adder from the same base computed the same value: it lost the race.
  EXPECT_FALSE(client.put_if_unchanged("/n", base, "5", &now, "token-b"));
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->value, "5");
  // Without a token, the retry cannot tell (what EtcdStore::add counted twice before).
  EXPECT_FALSE(client.put_if_unchanged("/n", base, "5", &now));
}

TEST(EtcdClient, GuardedWritesFence) {
  test::EtcdTestCluster cluster(3);
  EtcdClient client(cluster.endpoints());
  const int64_t term = client.create("/leader/x", "me");
  ASSERT_GT(term, 0);
  const EtcdGuard guard{"/leader/x", term};
  EXPECT_TRUE(client.put_if(guard, "/state/membership", "v1"));
  EXPECT_EQ(client.get("/state/membership")->value, "v1");

  // Deleted and created anew (another leader's key under the same name): the old token no
  // longer holds, and nothing is written.
  client.erase("/leader/x");
  EXPECT_FALSE(client.put_if(guard, "/state/membership", "stale"));
  client.create("/leader/x", "someone else");
  EXPECT_FALSE(client.put_if(guard, "/state/membership", "stale"));
  EXPECT_FALSE(client.erase_if(guard, "/state/", true));
  EXPECT_EQ(client.get("/state/membership")->value, "v1");
  const EtcdGuard now{"/leader/x", client.get("/leader/x")->create_revision};
  EXPECT_TRUE(client.erase_if(now, "/state/", true));
  EXPECT_FALSE(client.get("/state/membership").has_value());
}

TEST(EtcdClient, LeaseKeeperKeepsKeysAndRevokeDeletesThem) {
  test::EtcdTestCluster cluster(3);
  EtcdClient client(cluster.endpoints());
  const EtcdLease lease = client.lease_grant(seconds(1));
  EXPECT_GE(lease.ttl.count(), 2);  // etcd's minimum for a 1 s election timeout
  client.put("/lease/k", "v", lease.id);
  std::atomic<int> lapses{0};
  EtcdLeaseKeeper keeper(client, lease, [&] { ++lapses; });
  // Alive well past its TTL: the keeper refreshes it.
  const auto until = std::chrono::steady_clock::now() + lease.ttl + milliseconds(500);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(keeper.alive());
    ASSERT_TRUE(client.get("/lease/k").has_value());
    std::this_thread::sleep_for(milliseconds(100));
  }
  client.lease_revoke(lease.id);
  EXPECT_FALSE(client.get("/lease/k").has_value());
  // The keeper's next refresh finds it gone.
  EXPECT_TRUE(test::eventually([&] { return lapses == 1; }, seconds(10)));
  EXPECT_FALSE(keeper.alive());
  client.lease_revoke(lease.id);  // gone already: no error
}

TEST(EtcdClient, WatchDeliversEveryChangeInOrderUntilCancelled) {
  test::EtcdTestCluster cluster(3);
  EtcdClient client(cluster.endpoints());
  client.put("/w/before", "not seen: the watch starts after it");
  std::mutex mu;
  std::vector<EtcdEvent> seen;
  EtcdWatch watch(client, "/w/", true, [&](const std::vector<EtcdEvent>& events) {
    std::lock_guard<std::mutex> lock(mu);
    seen.insert(seen.end(), events.begin(), events.end());
  });
  client.put("/w/a", "1");
  client.put("/other", "not under the prefix");
  client.put("/w/b", "2");
  client.erase("/w/a");
  ASSERT_TRUE(test::eventually(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return seen.size() >= 3;
      },
      seconds(10)));
  watch.cancel();
  client.put("/w/c", "after cancel");
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].kv.key, "/w/a");
  EXPECT_EQ(seen[0].kv.value, "1");
  EXPECT_EQ(seen[1].kv.key, "/w/b");
  EXPECT_EQ(seen[2].type, EtcdEvent::Type::kDelete);
  EXPECT_EQ(seen[2].kv.key, "/w/a");
  EXPECT_LT(seen[0].kv.mod_revision, seen[1].kv.mod_revision);
}

TEST(EtcdClient, MalformedEndpointIsInputError) {
  const std::string msg = test::input_error_of([] { EtcdClient client({"etcd.example:2379"}); });
  EXPECT_HAS(msg, "etcd.example:2379");
  EXPECT_THROW(EtcdClient({}), InputError);
}

}  // namespace
}  // namespace keel
