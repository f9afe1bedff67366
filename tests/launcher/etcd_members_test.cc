// EtcdMember (launcher/etcd/etcd_members.h): members started, killed and stopped from
// outside, as keel-launch and the fault injection will. One member of three lost changes
// nothing; a lost quorum fails writes within their deadline, and they succeed again once it
// is back; nothing is left behind.
#include "launcher/etcd/etcd_members.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>

#include "etcd_test_cluster.h"
#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/etcd_watch.h"
#include "runtime/text.h"
#include "test_expect.h"

namespace keel {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// Whether `pid` is still a process (a zombie counts: not reaped yet).
bool process_exists(pid_t pid) {
  return ::kill(pid, 0) == 0;
}

TEST(EtcdMember, OneMemberKilledWritesGoOn) {
  test::EtcdTestCluster cluster(3);
  EtcdClient client(cluster.endpoints(), seconds(5));
  client.put("/k", "before");
  // The first member is the one the client's channel uses (pick_first): its loss is the
  // one that must be passed over.
  ASSERT_EQ(::kill(cluster.member(0).pid(), SIGKILL), 0);
  const auto start = steady_clock::now();
  client.put("/k", "after");  // within the deadline, through another member
  const auto ms = std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
  std::printf("first write after kill -9 of a member: %lld ms\n", (long long)ms.count());
  EXPECT_EQ(client.get("/k")->value, "after");
  EtcdClient others({cluster.member(1).endpoint(), cluster.member(2).endpoint()});
  EXPECT_EQ(others.get("/k")->value, "after");
}

// A new client whose first endpoint is a dead member (a standby promoted after slot 0's
// machine died) is in place within its first call's deadline: its watch and its calls go to
// a live member instead of waiting out the dead one.
TEST(EtcdMember, NewClientPassesOverADeadFirstMember) {
  test::EtcdTestCluster cluster(3);
  ASSERT_EQ(::kill(cluster.member(0).pid(), SIGKILL), 0);
  // The other two have their leader (an election may follow the loss): the dead member's
  // place in the list is what is measured, not the election.
  EtcdClient others({cluster.member(1).endpoint(), cluster.member(2).endpoint()}, seconds(10));
  others.put("/elected", "");
  const auto start = steady_clock::now();
  EtcdClient client(cluster.endpoints(), milliseconds(1000));
  std::atomic<int> seen{0};
  EtcdWatch watch(client, "/w", /*prefix=*/false, [&](const std::vector<EtcdEvent>&) { ++seen; });
  client.put("/w", "x");
  EXPECT_EQ(client.get("/w")->value, "x");
  EXPECT_TRUE(test::eventually([&] { return seen.load() > 0; }, seconds(2)));
  std::printf(
      "new client, watch and write with the first member dead: %lld ms\n",
      (long long)std::chrono::duration_cast<milliseconds>(steady_clock::now() - start).count());
}

// The member a client uses stops answering without closing its connection (SIGSTOP: a
// frozen machine, or one cut off by a partition): its calls move on to another member
// within the deadline instead of hanging on the silent one until keepalive notices (7 s).
TEST(EtcdMember, SilentMemberIsPassedOverWithinTheDeadline) {
  test::EtcdTestCluster cluster(3);
  EtcdClient client(cluster.endpoints(), milliseconds(4000));
  client.put("/k", "before");  // connected to the first member
  const pid_t frozen = cluster.member(0).pid();
  ASSERT_EQ(::kill(frozen, SIGSTOP), 0);
  const auto start = steady_clock::now();
  try {
    client.put("/k", "after");  // a new Raft leader may have to be elected first
  } catch (const std::exception& e) {
    ::kill(frozen, SIGCONT);
    FAIL() << e.what();
  }
  const auto ms = std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
  std::printf("first write after SIGSTOP of the member in use: %lld ms\n", (long long)ms.count());
  EXPECT_EQ(client.get("/k")->value, "after");
  ::kill(frozen, SIGCONT);
}

TEST(EtcdMember, QuorumLostFailsWithinDeadlineAndComesBack) {
  test::EtcdTestCluster cluster(3);
  const milliseconds deadline(1000);
  EtcdClient client(cluster.endpoints(), deadline);
  client.put("/k", "with quorum");
  const pid_t a = cluster.member(1).pid(), b = cluster.member(2).pid();
  ASSERT_EQ(::kill(a, SIGSTOP), 0);
  ASSERT_EQ(::kill(b, SIGSTOP), 0);
  const auto start = steady_clock::now();
  std::string msg;
  try {
    client.put("/k", "without quorum");
    ADD_FAILURE() << "a write without quorum succeeded";
  } catch (const EtcdUnavailable& e) {
    msg = e.what();
  }
  const auto took = std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
  EXPECT_LT(took, deadline + milliseconds(500)) << "the deadline was not kept";
  const std::string ep = cluster.member(0).endpoint();
  EXPECT_HAS(msg, ep.substr(ep.find("://") + 3));  // names the endpoints
  EXPECT_HAS(msg, "put /k");
  ASSERT_EQ(::kill(a, SIGCONT), 0);
  ASSERT_EQ(::kill(b, SIGCONT), 0);
  // Back once the members have caught up (an election may come first).
  const auto back = steady_clock::now();
  EXPECT_TRUE(test::eventually(
      [&] {
        try {
          client.put("/k", "quorum again");
          return true;
        } catch (const EtcdUnavailable&) {
          return false;
        }
      },
      seconds(30)));
  std::printf(
      "writes back %lld ms after SIGCONT\n",
      (long long)std::chrono::duration_cast<milliseconds>(steady_clock::now() - back).count());
  // Readable; or overwritten by a try of the write that failed: a try that reached a member
  // before it froze runs when it thaws (gRPC deadlines count from arrival). A write that
  // timed out has an unknown outcome, as with any etcd client (see EtcdClient::Impl::call).
  const std::string now = client.get("/k")->value;
  EXPECT_TRUE(now == "quorum again" || now == "without quorum") << now;
}

TEST(EtcdMember, StopReapsAndRemovesEverything) {
  std::vector<pid_t> pids;
  std::vector<std::string> data_dirs;
  std::string dir;
  {
    test::EtcdTestCluster cluster(3);
    dir = cluster.dir();
    for (int i = 0; i < 3; ++i) {
      pids.push_back(cluster.member(i).pid());
      data_dirs.push_back(cluster.member(i).spec().data_dir);
      EXPECT_TRUE(std::filesystem::is_directory(data_dirs.back()));
      EXPECT_GT(cluster.member(i).startup_time().count(), 0);
    }
    std::printf("member startup: %lld ms\n", (long long)cluster.member(0).startup_time().count());
    // Stopped and killed members are stopped all the same.
    ASSERT_EQ(::kill(pids[1], SIGSTOP), 0);
    ASSERT_EQ(::kill(pids[2], SIGKILL), 0);
    cluster.member(0).stop();
    EXPECT_EQ(cluster.member(0).pid(), -1);
    cluster.member(0).stop();  // idempotent
  }
  for (pid_t pid : pids) EXPECT_FALSE(process_exists(pid)) << "pid " << pid << " left";
  for (const auto& d : data_dirs) EXPECT_FALSE(std::filesystem::exists(d)) << d << " left";
}

TEST(EtcdMember, FailedStartShowsTheLog) {
  const std::string dir = test::temp_dir("etcd-bad");
  const std::vector<int> ports = free_tcp_ports("127.0.0.1", 2);
  EtcdMemberSpec s;
  s.name = "m0";
  s.host = "127.0.0.1";
  s.client_port = ports[0];
  s.peer_port = ports[1];
  s.data_dir = dir + "/m0.etcd";
  s.log_path = dir + "/m0.log";
  s.token = "bad";
  s.cluster = "m0=http://127.0.0.1:1";  // does not name this member's peer URL: etcd exits
  EtcdMember m(s);
  try {
    m.wait_healthy(seconds(30));
    ADD_FAILURE() << "a misconfigured member became healthy";
  } catch (const EtcdUnavailable& e) {
    EXPECT_HAS(e.what(), "exited while starting");
    EXPECT_HAS(e.what(), "m0.log");
    EXPECT_HAS(e.what(), "initial-cluster");  // etcd's own complaint, from its log
  }
  EXPECT_EQ(m.pid(), -1);
  s.host = "0.0.0.0";
  EXPECT_THROW(EtcdMember{s}, InputError);
}

}  // namespace
}  // namespace keel

namespace keel::test {
namespace {

// The members keel starts take TLS only, with client certificates of the job's CA (issue
// 29): a client with the job's key reads and writes; one with another job's key, and a plain
// gRPC client (what anyone with the address has), get nothing and change nothing.
TEST(EtcdMember, OnlyTheJobsCertificatesGetIn) {
  EtcdTestCluster cluster(1, "etcd-tls");
  const std::string ep = cluster.endpoints()[0];
  ASSERT_EQ(ep.rfind("https://", 0), 0u) << ep;
  EtcdClient mine({ep}, std::chrono::seconds(5));
  mine.put("/job/state", "ours");
  EtcdClient stranger({ep}, std::chrono::milliseconds(1500), JobKey::generate());
  EXPECT_THROW(stranger.put("/job/state", "theirs"), EtcdError);
  EtcdClient plain({ep.substr(std::string("https://").size())}, std::chrono::milliseconds(1500));
  EXPECT_THROW(plain.get("/job/state"), EtcdError);
  EXPECT_THROW(plain.put("/job/state", "theirs"), EtcdError);
  const auto kv = mine.get("/job/state");
  ASSERT_TRUE(kv);
  EXPECT_EQ(kv->value, "ours");
}

// Every member of a cluster keel started replaced, one at a time, each on a new address (as
// EtcdUpkeep replaces the members of lost machines): a client made before, with the first
// members' endpoints, follows the members etcd lists and still reads and writes when none of
// the members it was given is left. Without it, a long job's processes lost etcd for good
// once its first members were all gone (the 100-fault soak with in-job members, issue 44).
TEST(EtcdMember, AClientFollowsItsClusterAsEveryMemberIsReplaced) {
  test::EtcdTestCluster cluster(3, "etcd-follow");
  EtcdClient client(cluster.endpoints(), seconds(5));
  client.put("/follow/k", "0");
  const std::vector<std::string> given = client.endpoints();
  const std::vector<int> ports = free_tcp_ports("127.0.0.1", 6);
  std::vector<std::unique_ptr<EtcdMember>> fresh;
  for (int i = 0; i < 3; ++i) {
    const std::string old_name = cluster.member(i).spec().name;
    for (const EtcdMemberInfo& m : client.member_list())
      if (m.name == old_name) client.member_remove(m.id);
    cluster.member(i).stop();
    EtcdMemberSpec s = cluster.member(i).spec();
    s.name = "n" + std::to_string(i);
    s.client_port = ports[size_t(2 * i)];
    s.peer_port = ports[size_t(2 * i + 1)];
    s.data_dir = cluster.dir() + "/" + s.name + ".etcd";
    s.log_path = cluster.dir() + "/" + s.name + ".log";
    s.join_existing = true;
    // Added once etcd takes the change (a member add is not retried by the client, and etcd
    // refuses one until its leader has had a quorum for a while after the removal).
    const std::string peer = "https://127.0.0.1:" + std::to_string(s.peer_port);
    std::vector<EtcdMemberInfo> listed;
    const auto add_by = steady_clock::now() + seconds(30);
    while (listed.empty()) {
      try {
        uint64_t id = 0;
        listed = client.member_add(peer, &id);
      } catch (const EtcdError& e) {
        ASSERT_LT(steady_clock::now(), add_by) << e.what();
        std::this_thread::sleep_for(milliseconds(200));
        // A try whose answer was lost may have been applied.
        const std::vector<EtcdMemberInfo> now = client.member_list();
        for (const EtcdMemberInfo& m : now)
          if (std::find(m.peer_urls.begin(), m.peer_urls.end(), peer) != m.peer_urls.end())
            listed = now;
      }
    }
    s.cluster.clear();
    for (const EtcdMemberInfo& m : listed)
      for (const std::string& url : m.peer_urls)
        s.cluster +=
            (s.cluster.empty() ? "" : ",") + (m.name.empty() ? s.name : m.name) + "=" + url;
    fresh.push_back(std::make_unique<EtcdMember>(s));
    fresh.back()->wait_healthy(seconds(30));
    // The client's set takes the new member at its next look: within a second of a call that
    // found a member gone, or of look_at_members (EtcdUpkeep's client, once etcd is whole),
    // else within kFollowMembersEvery. The next replacement comes after it, as EtcdUpkeep's
    // do (one at a time, each once etcd lists every member started: seconds apart, against a
    // client that needs one member of its set alive).
    client.look_at_members();
    const std::string endpoint = fresh.back()->endpoint();
    auto followed = [&] {
      const std::vector<std::string> now = client.endpoints();
      return std::find(now.begin(), now.end(), endpoint) != now.end();
    };
    const auto deadline = steady_clock::now() + seconds(10);
    while (!followed() && steady_clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(50));
    ASSERT_TRUE(followed()) << "the client calls " << join(client.endpoints(), ",") << ", not "
                            << endpoint;
    client.put("/follow/k", std::to_string(i + 1));
  }
  for (const std::string& e : client.endpoints())
    EXPECT_EQ(std::find(given.begin(), given.end(), e), given.end()) << e << " is gone";
  EXPECT_EQ(client.get("/follow/k")->value, "3");
  client.put("/follow/k", "4");
  EXPECT_EQ(client.get("/follow/k")->value, "4");
}

// etcd's Raft leader handed from member to member (EtcdClient::move_leader, as EtcdUpkeep
// keeps it home) while two clients write through different members, one of them always a
// follower: no write fails (a leader handing over drops writes, "raft proposal dropped",
// and a forwarded one is lost until the attempt's timeout: both are tried again), and each
// move lands. A member killed is left out of member_statuses, which answers within its
// deadline.
TEST(EtcdMember, RaftLeaderMovesWhileWritesGoOn) {
  test::EtcdTestCluster cluster(3);
  const auto leader_of = [](const std::vector<EtcdStatus>& st) -> const EtcdStatus* {
    for (const auto& s : st)
      if (s.member_id == s.leader_id) return &s;
    return nullptr;
  };
  std::atomic<bool> stop{false};
  std::atomic<int> written{0}, failed{0};
  std::atomic<long long> longest_ms{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 2; ++w)
    writers.emplace_back([&, w] {
      const std::vector<std::string> e = cluster.endpoints();
      // Each client starts on another member (its first endpoint).
      EtcdClient client({e[w * 2], e[1], e[2 - w * 2]}, seconds(2));
      for (int i = 0; !stop.load(); ++i) {
        const auto start = steady_clock::now();
        try {
          client.put("/w" + std::to_string(w), std::to_string(i));
          ++written;
        } catch (const std::exception& ex) {
          ++failed;
          std::printf("writer %d: %s\n", w, ex.what());
        }
        const long long ms =
            std::chrono::duration_cast<milliseconds>(steady_clock::now() - start).count();
        longest_ms.store(std::max(longest_ms.load(), ms));
      }
    });
  // A failed assertion below returns with the writers running: they are stopped and joined
  // on the way out, not left to std::terminate.
  struct JoinOnExit {
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~JoinOnExit() {
      stop = true;
      for (auto& t : threads)
        if (t.joinable()) t.join();
    }
  } join_on_exit{stop, writers};
  EtcdClient admin(cluster.endpoints(), seconds(2));
  for (int move = 0; move < 6; ++move) {
    // Every member's status, the leader among them: a member busy beside a CPU hog may miss
    // one second's deadline, so asked again until all three answer.
    std::vector<EtcdStatus> st;
    ASSERT_TRUE(test::eventually(
        [&] {
          st = admin.member_statuses(steady_clock::now() + seconds(1));
          return st.size() == 3u && leader_of(st) != nullptr;
        },
        seconds(10)))
        << st.size() << " member(s) answered";
    const EtcdStatus* leader = leader_of(st);
    EXPECT_GT(leader->raft_index, 0u);
    uint64_t to = 0;  // the follower after the leader, round the list
    for (size_t i = 0; i < st.size() && !to; ++i)
      if (st[i].member_id == leader->member_id) to = st[(i + 1 + move % 2) % 3].member_id;
    if (to == leader->member_id) to = st[(move + 1) % 3].member_id;
    ASSERT_NE(to, leader->member_id);
    admin.move_leader(*leader, to, steady_clock::now() + seconds(2));
    EXPECT_TRUE(test::eventually(
        [&] {
          const auto now = admin.member_statuses(steady_clock::now() + seconds(1));
          const EtcdStatus* l = leader_of(now);
          return l && l->member_id == to;
        },
        seconds(5)))
        << "move " << move << " did not land";
    const int before = written.load();
    EXPECT_TRUE(test::eventually([&] { return written.load() > before + 2; }, seconds(10)));
  }
  stop = true;
  for (auto& t : writers) t.join();
  std::printf("%d writes across 6 leader moves, %d failed, the longest %lld ms\n", written.load(),
              failed.load(), longest_ms.load());
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(written.load(), 12);
  // A dead member does not answer: left out, the others within the deadline.
  ASSERT_EQ(::kill(cluster.member(1).pid(), SIGKILL), 0);
  EXPECT_TRUE(test::eventually(
      [&] { return admin.member_statuses(steady_clock::now() + milliseconds(200)).size() == 2; },
      seconds(5)));
}

}  // namespace
}  // namespace keel::test
