// How many etcd members a job runs and where (robust/etcd_member_place.h).
#include "robust/etcd_member_place.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace keel {
namespace {

TEST(EtcdMemberPlace, FiveMembersFromFiveSlotsThreeBelowNoneUnderThree) {
  EXPECT_EQ(etcd_member_count(1, 0), 0);
  EXPECT_EQ(etcd_member_count(2, 5), 0);
  EXPECT_EQ(etcd_member_count(3, 0), 3);
  EXPECT_EQ(etcd_member_count(4, 0), 3);
  EXPECT_EQ(etcd_member_count(5, 0), 5);
  EXPECT_EQ(etcd_member_count(6, 0), 5);
  EXPECT_EQ(etcd_member_count(1000, 0), 5);
  // Asked for: as asked, never more than the slots.
  EXPECT_EQ(etcd_member_count(6, 3), 3);
  EXPECT_EQ(etcd_member_count(4, 5), 4);
  EXPECT_EQ(etcd_members_survive(3), "one lost machine");
  EXPECT_EQ(etcd_members_survive(4), "one lost machine");
  EXPECT_EQ(etcd_members_survive(5), "two lost machines");
}

TEST(EtcdMemberPlace, WithoutDomainsSpreadOverTheSlotNumbers) {
  EXPECT_EQ(place_etcd_members(3, std::vector<std::string>(3)), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(place_etcd_members(3, std::vector<std::string>(4)), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(place_etcd_members(5, std::vector<std::string>(6)), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(place_etcd_members(5, std::vector<std::string>(10)), (std::vector<int>{0, 2, 4, 6, 8}));
  EXPECT_EQ(place_etcd_members(3, std::vector<std::string>(9)), (std::vector<int>{0, 3, 6}));
}

TEST(EtcdMemberPlace, OverAsManyDomainsAsThereAre) {
  // Two racks of four: 3 + 2, never 5 in one rack.
  const std::vector<std::string> two = {"a", "a", "a", "a", "b", "b", "b", "b"};
  EXPECT_EQ(place_etcd_members(5, two), (std::vector<int>{0, 1, 2, 4, 6}));
  // Racks of two slots each, five racks: one member a rack.
  const std::vector<std::string> five = {"r0", "r0", "r1", "r1", "r2",
                                         "r2", "r3", "r3", "r4", "r4"};
  EXPECT_EQ(place_etcd_members(5, five), (std::vector<int>{0, 2, 4, 6, 8}));
  // More racks than members: racks spread too.
  std::vector<std::string> many;
  for (int k = 0; k < 20; ++k) many.push_back("r" + std::to_string(k));
  EXPECT_EQ(place_etcd_members(5, many), (std::vector<int>{0, 4, 8, 12, 16}));
  // A rack of one slot gives what it has; the rest go round the others.
  const std::vector<std::string> small = {"a", "b", "b", "b", "b", "b"};
  EXPECT_EQ(place_etcd_members(5, small), (std::vector<int>{0, 1, 2, 3, 4}));
}

// Every placement, whatever the domains: n distinct slots in range, ascending; as many
// domains as there can be; shares that differ by at most one among domains with slots to
// spare; and where every domain has the slots for an even share, no one domain lost (a rack,
// a switch) costs the quorum once there are three domains or more.
TEST(EtcdMemberPlace, EveryPlacementKeepsItsPromises) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const int slots = 3 + int(rng() % 40);
    const int ndomains = 1 + int(rng() % 8);
    std::vector<std::string> domains;
    for (int k = 0; k < slots; ++k) {
      // Runs of neighbouring slots share a domain, as racks do, with some scatter.
      const int d = rng() % 4 == 0 ? int(rng() % ndomains) : k * ndomains / slots;
      domains.push_back("d" + std::to_string(d));
    }
    const int n = etcd_member_count(slots, 0);
    const std::vector<int> at = place_etcd_members(n, domains);
    ASSERT_EQ(int(at.size()), n);
    ASSERT_TRUE(std::is_sorted(at.begin(), at.end()));
    ASSERT_EQ(std::set<int>(at.begin(), at.end()).size(), at.size());
    std::map<std::string, int> slots_in, members_in;
    for (const auto& d : domains) ++slots_in[d];
    for (int k : at) {
      ASSERT_GE(k, 0);
      ASSERT_LT(k, slots);
      ++members_in[domains[size_t(k)]];
    }
    const int distinct = int(slots_in.size());
    EXPECT_EQ(int(members_in.size()), std::min(n, distinct));
    int lo = n, hi = 0;
    for (const auto& [d, count] : slots_in) {
      const int m = members_in.count(d) ? members_in[d] : 0;
      if (m < count) lo = std::min(lo, m);  // a domain that could take more
      hi = std::max(hi, m);
    }
    if (lo < n) {
      EXPECT_LE(hi - lo, 1);
    }
    const int even = (n + distinct - 1) / distinct;
    const bool roomy = std::all_of(slots_in.begin(), slots_in.end(),
                                   [&](const auto& d) { return d.second >= even; });
    if (distinct >= 3 && roomy) {
      for (const auto& [d, m] : members_in) {
        EXPECT_GT(n - m, n / 2) << "domain " << d;
      }
    }
  }
}

TEST(EtcdMemberPlace, AReplacementGoesToTheDomainWithTheFewestMembers) {
  const std::vector<std::string> domains = {"a", "a", "b", "b", "c", "c"};
  // Members kept on 0 (a), 2 (b), 3 (b), 4 (c): a and c have one each, a's slot 1 first.
  EXPECT_EQ(etcd_replacement_slot({1, 5}, {0, 2, 3, 4}, domains), 1);
  // Kept on 0, 1 (a), 2 (b): c's slot 5 though slot 3 comes first.
  EXPECT_EQ(etcd_replacement_slot({3, 5}, {0, 1, 2}, domains), 5);
  EXPECT_EQ(etcd_replacement_slot({}, {0, 1, 2}, domains), -1);
  // Without domains: the lowest free slot, as before.
  EXPECT_EQ(etcd_replacement_slot({3, 4}, {0, 2}, std::vector<std::string>(6)), 3);
}

}  // namespace
}  // namespace keel
