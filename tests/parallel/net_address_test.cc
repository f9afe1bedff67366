// reachable_address(): loopback peers, the KEEL_IFNAME override and its error, and the
// route rule toward an address of this machine. The rule across real machines (network
// namespaces) is tested in tests/integration/netns_test.cc.
#include "parallel/net_address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "test_expect.h"

namespace keel {
namespace {

// Sets or unsets KEEL_IFNAME for one test and restores the value it had.
class IfnameEnv {
 public:
  explicit IfnameEnv(const char* value) {
    if (const char* old = std::getenv("KEEL_IFNAME")) old_ = old;
    if (value) {
      ::setenv("KEEL_IFNAME", value, 1);
    } else {
      ::unsetenv("KEEL_IFNAME");
    }
  }
  ~IfnameEnv() {
    if (old_) {
      ::setenv("KEEL_IFNAME", old_->c_str(), 1);
    } else {
      ::unsetenv("KEEL_IFNAME");
    }
  }

 private:
  std::optional<std::string> old_;
};

bool is_ipv4(const std::string& s) {
  in_addr a{};
  return ::inet_pton(AF_INET, s.c_str(), &a) == 1;
}

TEST(NetAddress, InterfacesIncludeLoopback) {
  bool lo = false;
  for (const auto& [name, addr] : ipv4_interfaces()) {
    EXPECT_TRUE(is_ipv4(addr)) << name << " " << addr;
    lo = lo || (name == "lo" && addr == "127.0.0.1");
  }
  EXPECT_TRUE(lo) << "lo with 127.0.0.1 not listed";
}

TEST(NetAddress, LoopbackPeerGivesLoopback) {
  IfnameEnv env(nullptr);
  EXPECT_EQ(reachable_address("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(reachable_address("127.3.4.5"), "127.0.0.1");
  EXPECT_EQ(reachable_address("localhost"), "127.0.0.1");
  EXPECT_EQ(reachable_address("::1"), "127.0.0.1");
}

TEST(NetAddress, IfnamePicksThatInterface) {
  IfnameEnv env("lo");
  EXPECT_EQ(reachable_address("127.0.0.1"), "127.0.0.1");
  // The variable wins over the route: whatever the peer, lo's address is the answer.
  for (const auto& [name, addr] : ipv4_interfaces()) {
    EXPECT_EQ(reachable_address(addr), "127.0.0.1") << "toward " << name << " " << addr;
  }
}

TEST(NetAddress, EmptyIfnameIsIgnored) {
  IfnameEnv env("");
  EXPECT_EQ(reachable_address("127.0.0.1"), "127.0.0.1");
}

TEST(NetAddress, BogusIfnameNamesVariableAndInterfaces) {
  IfnameEnv env("nosuchif0");
  std::string msg = test::input_error_of([] { reachable_address("127.0.0.1"); });
  EXPECT_HAS(msg, "KEEL_IFNAME=nosuchif0");
  EXPECT_HAS(msg, "lo (127.0.0.1)");
}

// The route toward one of this machine's own addresses starts at that address: the kernel's
// local table routes it over lo with the address itself as source. (A UDP connect sends
// nothing, so this probes no other machine.)
TEST(NetAddress, RouteRuleTowardOwnAddress) {
  IfnameEnv env(nullptr);
  for (const auto& [name, addr] : ipv4_interfaces()) {
    if (name == "lo") continue;
    EXPECT_EQ(reachable_address(addr), addr) << "toward " << name;
  }
}

}  // namespace
}  // namespace keel
