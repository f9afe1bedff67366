// LeaderElection (launcher/etcd/leader_election.h): two controller candidates on a real
// cluster. One leads; when its lease ends the other leads, within about the TTL when the
// leader just stops (a crash); the old leader's fenced writes are refused and write nothing;
// observers see every change.
#include "launcher/etcd/etcd_store.h"
#include "launcher/etcd/leader_election.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "etcd_test_cluster.h"
#include "test_expect.h"

namespace keel {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

const std::string kPrefix = "/keel/job/leader/";

// The values an observer was called back with ("" for no leader).
struct Seen {
  std::mutex mu;
  std::vector<std::string> values;
  void add(const std::optional<LeaderInfo>& l) {
    std::lock_guard<std::mutex> lock(mu);
    values.push_back(l ? l->value : "");
  }
  bool has(const std::string& v) {
    std::lock_guard<std::mutex> lock(mu);
    return std::find(values.begin(), values.end(), v) != values.end();
  }
};

TEST(LeaderElection, RevokedLeaseHandsOverAndFencesTheOldLeader) {
  test::EtcdTestCluster cluster(3);
  EtcdClient client_a(cluster.endpoints()), client_b(cluster.endpoints());
  EtcdClient agent(cluster.endpoints());
  Seen seen;
  LeaderObserver observer(agent, kPrefix, [&](const auto& l) { seen.add(l); });
  std::atomic<int> a_lost{0};
  LeaderElection a(client_a, kPrefix, seconds(2), [&] { ++a_lost; });
  LeaderElection b(client_b, kPrefix, seconds(2));
  ASSERT_TRUE(a.campaign("tcp://a:1", seconds(10)));
  EXPECT_FALSE(b.campaign("tcp://b:1", milliseconds(300)));  // waits in line
  EXPECT_TRUE(a.is_leader());
  EXPECT_FALSE(b.is_leader());
  EXPECT_EQ(b.leader()->value, "tcp://a:1");
  a.fenced_put("/keel/job/membership", "epoch 1");
  EXPECT_THROW(b.fenced_put("/keel/job/membership", "not the leader"), LostLeadership);
  EXPECT_TRUE(test::eventually([&] { return seen.has("tcp://a:1"); }, seconds(10)));

  // A's lease ends (revoked from outside: what etcd does when it expires): A stops leading
  // at once, B leads.
  const auto start = steady_clock::now();
  agent.lease_revoke(client_a.get(a.guard().key)->lease);
  ASSERT_TRUE(b.campaign("tcp://b:1", seconds(10)));
  std::printf(
      "handover after revoke: %lld ms\n",
      (long long)std::chrono::duration_cast<milliseconds>(steady_clock::now() - start).count());
  EXPECT_GT(b.guard().create_revision, a.guard().create_revision);  // a later term
  EXPECT_TRUE(test::eventually([&] { return !a.is_leader() && a_lost == 1; }, seconds(10)));
  b.fenced_put("/keel/job/membership", "epoch 2");
  EXPECT_THROW(a.fenced_put("/keel/job/membership", "stale epoch 1"), LostLeadership);
  EXPECT_EQ(agent.get("/keel/job/membership")->value, "epoch 2");
  EXPECT_TRUE(test::eventually([&] { return seen.has("tcp://b:1"); }, seconds(10)));
  EXPECT_THROW(a.campaign("tcp://a:1", seconds(1)), LostLeadership);  // that candidacy is over
}

// The ranks' store as a leader writes it (EtcdStore::fence): every write is refused by etcd
// once another leads, even when the writer still believes it leads (a leader paused between
// its own check and its write: the guard it holds is the stale one), and nothing lands.
TEST(LeaderElection, AStoreFencedOnADeposedLeaderWritesNothing) {
  test::EtcdTestCluster cluster(3);
  EtcdClient client_a(cluster.endpoints()), client_b(cluster.endpoints());
  EtcdClient reader(cluster.endpoints());
  LeaderElection a(client_a, kPrefix, seconds(2));
  LeaderElection b(client_b, kPrefix, seconds(2));
  ASSERT_TRUE(a.campaign("tcp://a:1", seconds(10)));
  const EtcdGuard held = a.guard();  // what A believes, whatever etcd says later
  EtcdStore store(cluster.endpoints(), "/keel/job/store/");
  store.fence([held] { return held; });
  store.set("abort/1", "stop");
  store.set_all({{"rebuild/1", "epoch 1"}, {"incident/0", "crash"}});
  EXPECT_EQ(store.add("incidents", 1), 1);
  store.erase({"incident/0"}, {});
  EXPECT_EQ(reader.get("/keel/job/store/abort/1")->value, "stop");
  EXPECT_FALSE(reader.get("/keel/job/store/incident/0"));

  // A's lease ends; B leads. A's store still holds A's guard.
  reader.lease_revoke(reader.get(held.key)->lease);
  ASSERT_TRUE(b.campaign("tcp://b:1", seconds(10)));
  EXPECT_THROW(store.set("abort/2", "a deposed leader's abort"), LostLeadership);
  EXPECT_THROW(store.set_all({{"rebuild/2", "x"}, {"abort/1", "y"}}), LostLeadership);
  EXPECT_THROW(store.add("incidents", 1), LostLeadership);
  EXPECT_THROW(store.erase({"abort/1"}, {}), LostLeadership);
  EXPECT_THROW(store.erase({}, {"rebuild/"}), LostLeadership);
  EXPECT_FALSE(reader.get("/keel/job/store/abort/2"));
  EXPECT_FALSE(reader.get("/keel/job/store/rebuild/2"));
  EXPECT_EQ(reader.get("/keel/job/store/abort/1")->value, "stop");
  EXPECT_EQ(reader.get("/keel/job/store/rebuild/1")->value, "epoch 1");
  EXPECT_EQ(reader.get("/keel/job/store/incidents")->value, "1");

  // B's store writes: the fence is B's term.
  EtcdStore b_store(cluster.endpoints(), "/keel/job/store/");
  b_store.fence([&b] { return b.guard(); });
  b_store.set("abort/2", "the new leader's");
  EXPECT_EQ(b_store.add("incidents", 1), 2);
  // No leadership at all: nothing is sent.
  EtcdStore none(cluster.endpoints(), "/keel/job/store/");
  none.fence([] { return EtcdGuard{}; });
  EXPECT_THROW(none.set("abort/3", "x"), LostLeadership);
  EXPECT_FALSE(reader.get("/keel/job/store/abort/3"));
}

TEST(LeaderElection, CrashedLeaderIsReplacedWithinTheTtl) {
  test::EtcdTestCluster cluster(3);
  EtcdClient client_a(cluster.endpoints()), client_b(cluster.endpoints());
  LeaderElection a(client_a, kPrefix, seconds(1));
  LeaderElection b(client_b, kPrefix, seconds(1));
  ASSERT_TRUE(a.campaign("tcp://a:1", seconds(10)));
  EXPECT_FALSE(b.campaign("tcp://b:1", milliseconds(100)));
  Seen seen;
  auto observer = b.observe([&](const auto& l) { seen.add(l); });
  const EtcdGuard old = a.guard();
  // A stops refreshing its lease and does nothing more, as a killed controller.
  const auto start = steady_clock::now();
  a.abandon();
  EXPECT_FALSE(a.is_leader());
  ASSERT_TRUE(b.campaign("tcp://b:1", seconds(10)));
  const auto handover = std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
  std::printf("handover after a crash, lease TTL %d s: %lld ms\n", 1, (long long)handover.count());
  // The lease etcd granted is 2 s (its minimum): handover once it expires, within its checks.
  EXPECT_LT(handover, milliseconds(2000 + 1500));
  EXPECT_TRUE(test::eventually([&] { return seen.has("tcp://b:1"); }, seconds(10)));
  // What A would write with its old token is refused.
  EXPECT_FALSE(client_a.put_if(old, "/keel/job/membership", "from the dead"));
  EXPECT_FALSE(client_a.get("/keel/job/membership").has_value());
  b.resign();
  EXPECT_FALSE(b.is_leader());
  EXPECT_TRUE(test::eventually([&] { return seen.has(""); }, seconds(10)));  // none leads
  EXPECT_FALSE(b.leader().has_value());
}

}  // namespace
}  // namespace keel
