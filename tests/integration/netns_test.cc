// NetnsLab, the fixture that makes machines of network namespaces: machines reach each
// other over their own addresses, a cut link is a partition that leaves processes alive
// and heals, a killed machine leaves no process, a destroyed lab leaves no namespace, and
// reachable_address() inside a machine gives that machine's address.
#include "integration/netns.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "parallel/comm_error.h"
#include "parallel/net_address.h"
#include "parallel/socket_util.h"
#include "parallel/tcp_store.h"
#include "test_expect.h"

namespace keel::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class Netns : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!NetnsLab::available(&why)) GTEST_SKIP() << why;
  }
};

// From machine `from` of `lab`: a store round trip with the server at `host`:`port`.
void expect_store_works(NetnsLab& lab, int from, const std::string& host, int port) {
  lab.run_in(from, [&] {
    TcpStore store(host, port, 5s);
    const std::string key = "from" + std::to_string(from);
    store.set(key, lab.address(from));
    EXPECT_EQ(store.get(key, 5s), lab.address(from));
  });
}

// Waits up to 5 s for cond().
template <typename F>
bool eventually(F cond) {
  const auto deadline = Clock::now() + 5s;
  while (!cond()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::string ip_output(const std::string& args) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(("ip " + args + " 2>&1").c_str(), "r"), ::pclose);
  char buf[512];
  while (p && std::fgets(buf, sizeof(buf), p.get())) out += buf;
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST_F(Netns, PartitionCutsOneMachineAndHeals) {
  NetnsLab lab(3);
  // The server's listening socket is made inside machine 0 and stays there.
  std::unique_ptr<TcpStoreServer> server;
  lab.run_in(0, [&] { server = std::make_unique<TcpStoreServer>(lab.address(0), 0); });
  const int port = server->port();
  expect_store_works(lab, 1, lab.address(0), port);
  expect_store_works(lab, 2, lab.address(0), port);

  pid_t sleeper = lab.spawn(1, {"sleep", "30"});
  lab.cut(1);
  // A cut machine cannot connect: the attempt ends in a typed timeout (not a refusal, and
  // not a hang).
  lab.run_in(1, [&] {
    EXPECT_THROW(detail::connect_tcp(lab.address(0), port, Clock::now() + 1s, "machine 0"),
                 CommTimeout);
  });
  expect_store_works(lab, 2, lab.address(0), port);
  EXPECT_EQ(::kill(sleeper, 0), 0) << "a partition must leave machine 1's processes alive";

  lab.heal(1);
  expect_store_works(lab, 1, lab.address(0), port);
  server->stop();
}

TEST_F(Netns, SpawnRunsInsideTheMachineWithEnvAndLog) {
  NetnsLab lab(2);
  const std::string log = ::testing::TempDir() + "netns_spawn.log";
  pid_t pid =
      lab.spawn(1, {"sh", "-c", "echo FOO=$FOO; ip -4 -o addr show dev eth0"}, {"FOO=bar"}, log);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_file(log);
  const std::string out = read_file(log);
  EXPECT_HAS(out, "FOO=bar");
  EXPECT_HAS(out, lab.address(1) + "/24");
  EXPECT_THROW(lab.spawn(0, {"/no/such/program"}), Error);
  EXPECT_EQ(lab.exec_prefix(1), "ip netns exec " + lab.ns_name(1) + " ");
}

TEST_F(Netns, KillMachineLeavesNoProcessInIt) {
  NetnsLab lab(3);
  // A process tree, so the kill must find children the test never saw.
  lab.spawn(2, {"sh", "-c", "sleep 30 & sleep 30 & wait"});
  pid_t other = lab.spawn(1, {"sleep", "30"});
  ASSERT_TRUE(eventually([&] { return lab.processes_in(2).size() >= 3; }))
      << lab.processes_in(2).size() << " processes in machine 2";
  lab.kill_machine(2);
  EXPECT_TRUE(lab.processes_in(2).empty());
  EXPECT_EQ(lab.processes_in(1), std::vector<pid_t>{other}) << "only machine 2 is lost";
}

// A machine cut off from inside (what keel's partition fault does: eth0 down in its own
// namespace), with a process and a shared-memory file left in it, comes back from repair()
// empty and reachable, and the other machines keep their processes.
TEST_F(Netns, RepairBringsACutMachineBackEmpty) {
  NetnsLab lab(3);
  std::unique_ptr<TcpStoreServer> server;
  lab.run_in(0, [&] { server = std::make_unique<TcpStoreServer>(lab.address(0), 0); });
  const int port = server->port();
  pid_t other = lab.spawn(2, {"sleep", "30"});
  const std::string shm = lab.shm_dir(1) + "/keel-repair-test";
  pid_t cutter =
      lab.spawn(1, {"sh", "-c", "echo x > /dev/shm/keel-repair-test && ip link set dev eth0 down"});
  int status = 0;
  ASSERT_EQ(::waitpid(cutter, &status, 0), cutter);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  lab.spawn(1, {"sleep", "30"});
  ASSERT_TRUE(std::filesystem::exists(shm));
  lab.run_in(1, [&] {
    EXPECT_THROW(detail::connect_tcp(lab.address(0), port, Clock::now() + 1s, "machine 0"),
                 CommTimeout);
  });

  lab.repair(1);
  EXPECT_TRUE(lab.processes_in(1).empty());
  EXPECT_FALSE(std::filesystem::exists(shm));
  expect_store_works(lab, 1, lab.address(0), port);
  EXPECT_EQ(lab.processes_in(2), std::vector<pid_t>{other});
  server->stop();
}

TEST_F(Netns, DestroyedLabLeavesNothing) {
  std::vector<std::string> names;
  std::string bridge;
  pid_t sleeper = -1;
  {
    NetnsLab lab(2);
    for (int i = 0; i < lab.size(); ++i) names.push_back(lab.ns_name(i));
    bridge = lab.bridge_name();
    sleeper = lab.spawn(0, {"sleep", "30"});
  }
  const std::string list = ip_output("netns list");
  for (const auto& n : names) EXPECT_EQ(list.find(n), std::string::npos) << list;
  EXPECT_EQ(ip_output("-o link show").find(bridge), std::string::npos);
  EXPECT_EQ(::kill(sleeper, 0), -1) << "the lab must kill and reap what it spawned";
}

TEST_F(Netns, CleanupRemovesLeftoversOfDeadProcesses) {
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string ns = "keel" + std::to_string(dead) + "m0";
  ASSERT_EQ(ip_output("netns add " + ns), "");
  NetnsLab::cleanup_stale();
  EXPECT_EQ(ip_output("netns list").find(ns), std::string::npos);
}

TEST_F(Netns, ReachableAddressInsideAMachine) {
  NetnsLab lab(2);
  lab.run_in(1, [&] {
    // The route rule: toward machine 0 (or the bridge) the source is machine 1's eth0.
    ::unsetenv("KEEL_IFNAME");
    EXPECT_EQ(reachable_address(lab.address(0)), lab.address(1));
    EXPECT_EQ(reachable_address(lab.bridge_address()), lab.address(1));
    EXPECT_EQ(reachable_address("127.0.0.1"), "127.0.0.1");
    ::setenv("KEEL_IFNAME", lab.ifname().c_str(), 1);
    EXPECT_EQ(reachable_address("127.0.0.1"), lab.address(1));
    ::unsetenv("KEEL_IFNAME");
  });
}

}  // namespace
}  // namespace keel::test
