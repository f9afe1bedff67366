// The controller's membership state machine (launcher/controller/membership.h): every
// transition, the refusals of impossible ones (which change nothing), and the two
// derivations (the policy's ClusterView, the membership.Membership a Rebuild carries).
#include "launcher/controller/membership.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

using St = membership::SlotInfo;
using Link = JobMembership::Link;
using Role = JobMembership::Role;

// TP2×PP1×DP2 on 2 workers a slot: slots 0 and 1 run ranks {0,1} and {2,3}; slots 2 and 3
// are standbys.
JobMembership four_slots() {
  return JobMembership(Topology(2, 1, 2), 2, SlotLayout{4, 2, 2});
}

void register_all(JobMembership* m) {
  for (int k = 0; k < m->slot_count(); ++k) m->register_slot(k);
}

// Makes standby `slot` ready (its check begun and passed).
void ready(JobMembership* m, int slot) {
  const int gen = m->begin_standby_check(slot);
  ASSERT_TRUE(m->standby_checked(slot, gen, true));
}

TEST(Membership, StartsInMegatronOrderWithTheLastSlotsAsStandbysAllPending) {
  const JobMembership m = four_slots();
  EXPECT_EQ(m.epoch(), 0);
  EXPECT_EQ(m.world(), 4);
  EXPECT_EQ(m.slot_of(0), 0);
  EXPECT_EQ(m.slot_of(1), 0);
  EXPECT_EQ(m.slot_of(2), 1);
  EXPECT_EQ(m.slot_of(3), 1);
  EXPECT_EQ(m.ranks_on(1), (std::vector<int>{2, 3}));
  EXPECT_TRUE(m.ranks_on(2).empty());
  for (int k = 0; k < 4; ++k) EXPECT_EQ(m.state(k), St::pending) << k;
  EXPECT_EQ(m.role(2), Role::kStandby);
  EXPECT_TRUE(m.initial_standby(3));
  EXPECT_FALSE(m.initial_standby(1));
  EXPECT_EQ(m.initial_standbys(), 2);
}

TEST(Membership, WithoutSlotsThereIsNoPlacement) {
  const JobMembership m(Topology(1, 1, 4), 4, SlotLayout{});
  EXPECT_FALSE(m.has_slots());
  EXPECT_EQ(m.slot_of(3), -1);
  const policy::ClusterView v = m.view();
  EXPECT_FALSE(v.has_slots());
  EXPECT_TRUE(v.slots.empty());
  EXPECT_EQ(v.workers_per_slot, 1);
  EXPECT_EQ(v.topo.dp(), 4);
}

TEST(Membership, TooManyStandbysAreRefused) {
  EXPECT_THROW(JobMembership(Topology(1, 1, 2), 2, SlotLayout{2, 2, 1}), MembershipError);
}

TEST(Membership, RegisterMakesASlotActiveAndAStandbyStartsItsCheck) {
  JobMembership m = four_slots();
  JobMembership::Registered r = m.register_slot(1);
  EXPECT_FALSE(r.rejoined);
  EXPECT_FALSE(r.start_check);
  EXPECT_EQ(m.state(1), St::active);
  r = m.register_slot(2);
  EXPECT_TRUE(r.start_check);
  EXPECT_EQ(m.state(2), St::standby);
  EXPECT_THROW(m.register_slot(4), MembershipError);
  EXPECT_THROW(m.register_slot(-1), MembershipError);
}

TEST(Membership, HeartbeatLostOnlyFromUp) {
  JobMembership m = four_slots();
  EXPECT_THROW(m.heartbeat_lost(1), MembershipError);  // pending: never up
  m.register_slot(1);
  m.heartbeat_lost(1);
  EXPECT_EQ(m.state(1), St::lost);
  EXPECT_EQ(m.link(1), Link::kLost);
  EXPECT_EQ(m.ranks_on(1), (std::vector<int>{2, 3}));  // until the transition moves them
  EXPECT_THROW(m.heartbeat_lost(1), MembershipError);  // lost already
}

// detect.on_slot_loss = wait: a lost slot whose ranks stayed comes back active.
TEST(Membership, ALostSlotThatKeptItsRanksRejoinsActive) {
  JobMembership m = four_slots();
  register_all(&m);
  m.heartbeat_lost(1);
  const JobMembership::Registered r = m.register_slot(1);
  EXPECT_TRUE(r.rejoined);
  EXPECT_FALSE(r.start_check);
  EXPECT_EQ(m.state(1), St::active);
}

TEST(Membership, StandbyCheckGenerationsAndResults) {
  JobMembership m = four_slots();
  register_all(&m);
  EXPECT_THROW(m.begin_standby_check(1), MembershipError);  // active: no standby
  const int g1 = m.begin_standby_check(2);
  EXPECT_EQ(g1, 1);
  EXPECT_EQ(m.standby_gen(2), 1);
  EXPECT_FALSE(m.ready(2));
  EXPECT_EQ(m.view().pending_standbys, (std::set<int>{2, 3}));
  const int g2 = m.begin_standby_check(2);
  EXPECT_FALSE(m.standby_checked(2, g1, true));  // an older generation's result: ignored
  EXPECT_FALSE(m.ready(2));
  EXPECT_TRUE(m.standby_checked(2, g2, true));
  EXPECT_TRUE(m.ready(2));
  EXPECT_EQ(m.view().ready_standbys, (std::set<int>{2}));
  // A failed check is not worth waiting for: neither ready nor pending.
  const int g3 = m.begin_standby_check(3);
  EXPECT_TRUE(m.standby_checked(3, g3, false));
  EXPECT_TRUE(m.check_failed(3));
  EXPECT_EQ(m.view().pending_standbys, std::set<int>{});
  EXPECT_THROW(m.standby_checked(1, 1, true), MembershipError);  // no standby
}

TEST(Membership, EvictedSlotComesBackAsAStandby) {
  JobMembership m = four_slots();
  register_all(&m);
  m.evict(1);
  EXPECT_EQ(m.state(1), St::evicted);
  m.evict(1);  // evicted already: stays so
  EXPECT_EQ(m.state(1), St::evicted);
  const JobMembership::Registered r = m.register_slot(1);
  EXPECT_TRUE(r.rejoined);
  EXPECT_TRUE(r.start_check);
  EXPECT_EQ(m.state(1), St::standby);
  EXPECT_THROW(m.evict(2), MembershipError);  // a standby holds no ranks to evict
  EXPECT_EQ(m.state(2), St::standby);
}

TEST(Membership, PromoteMovesTheRanksOntoAReadyStandby) {
  JobMembership m = four_slots();
  register_all(&m);
  m.heartbeat_lost(1);
  EXPECT_THROW(m.promote(1, 2), MembershipError);  // not ready yet
  EXPECT_EQ(m.ranks_on(1), (std::vector<int>{2, 3}));
  ready(&m, 2);
  const std::vector<int> moved = m.promote(1, 2);
  EXPECT_EQ(moved, (std::vector<int>{2, 3}));
  EXPECT_EQ(m.slot_of(2), 2);
  EXPECT_EQ(m.slot_of(3), 2);
  EXPECT_EQ(m.state(2), St::active);
  EXPECT_EQ(m.role(1), Role::kEvicted);
  EXPECT_EQ(m.state(1), St::lost);  // lost until it registers again...
  const JobMembership::Registered r = m.register_slot(1);
  EXPECT_TRUE(r.start_check);  // ... then a standby: its ranks moved away
  EXPECT_EQ(m.state(1), St::standby);
}

TEST(Membership, PromoteRefusesWhatCannotBe) {
  JobMembership m = four_slots();
  register_all(&m);
  ready(&m, 2);
  EXPECT_THROW(m.promote(3, 2), MembershipError);  // slot 3 holds no ranks
  EXPECT_THROW(m.promote(1, 0), MembershipError);  // slot 0 is no standby
  EXPECT_THROW(m.promote(1, 7), MembershipError);  // no slot 7
  m.heartbeat_lost(2);
  EXPECT_THROW(m.promote(1, 2), MembershipError);  // a lost standby
  EXPECT_EQ(m.ranks_on(1), (std::vector<int>{2, 3}));
}

// A live slot evicted a moment ago registered again and checks itself: promote keeps it a
// standby.
TEST(Membership, PromoteLeavesAnEvictedSlotThatRegisteredAgainAStandby) {
  JobMembership m = four_slots();
  register_all(&m);
  ready(&m, 2);
  m.evict(1);
  m.register_slot(1);
  EXPECT_EQ(m.promote(1, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(m.state(1), St::standby);
}

// Shrink: replica 1 (ranks 1 and 3 at TP1×DP... here TP2: ranks 2, 3) retires; grow: a new
// replica is placed on a ready standby.
TEST(Membership, RenumberAndPlace) {
  JobMembership m = four_slots();
  register_all(&m);
  m.renumber({{0, 0}, {1, 1}}, Topology(2, 1, 1));
  EXPECT_EQ(m.world(), 2);
  EXPECT_EQ(m.topo().dp(), 1);
  EXPECT_EQ(m.ranks_on(1), std::vector<int>{});
  m.evict(1);  // retired: it checks itself and becomes a standby
  EXPECT_EQ(m.configured_dp(), 2);

  EXPECT_EQ(m.placeable(), 0);
  m.renumber({{0, 0}, {1, 1}}, Topology(2, 1, 2));
  EXPECT_EQ(m.slot_of(2), -1);  // unplaced
  EXPECT_THROW(m.place({2, 3}), MembershipError);
  ready(&m, 3);
  EXPECT_EQ(m.placeable(), 2);
  const std::vector<JobMembership::Placement> p = m.place({2, 3});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].rank, 2);
  EXPECT_EQ(p[0].slot, 3);
  EXPECT_EQ(p[0].index, 0);
  EXPECT_EQ(p[1].index, 1);
  EXPECT_EQ(m.state(3), St::active);
  EXPECT_EQ(m.ranks_on(3), (std::vector<int>{2, 3}));
}

TEST(Membership, RenumberRefusesBadMaps) {
  JobMembership m = four_slots();
  EXPECT_THROW(m.renumber({{4, 0}}, Topology(2, 1, 1)), MembershipError);          // old id
  EXPECT_THROW(m.renumber({{0, 2}}, Topology(2, 1, 1)), MembershipError);          // new id
  EXPECT_THROW(m.renumber({{0, 0}, {1, 0}}, Topology(2, 1, 1)), MembershipError);  // twice
  EXPECT_EQ(m.world(), 4);                                                         // unchanged
  EXPECT_EQ(m.slot_of(3), 1);
}

TEST(Membership, EpochsFollowOneAnother) {
  JobMembership m = four_slots();
  EXPECT_THROW(m.next_epoch(2), MembershipError);
  EXPECT_THROW(m.next_epoch(0), MembershipError);
  m.next_epoch(1);
  EXPECT_EQ(m.epoch(), 1);
}

TEST(Membership, ViewAndProtoSayTheSame) {
  JobMembership m = four_slots();
  register_all(&m);
  ready(&m, 2);
  m.begin_standby_check(3);
  m.heartbeat_lost(1);
  m.next_epoch(1);
  const policy::ClusterView v = m.view();
  EXPECT_EQ(v.rank_slot, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(v.workers_per_slot, 2);
  EXPECT_EQ(v.configured_dp, 2);
  EXPECT_EQ(v.slots.at(0), St::active);
  EXPECT_EQ(v.slots.at(1), St::lost);
  EXPECT_EQ(v.ready_standbys, std::set<int>{2});
  EXPECT_EQ(v.pending_standbys, std::set<int>{3});
  const membership::Membership p = m.to_proto();
  EXPECT_EQ(p.epoch(), 1);
  EXPECT_EQ(p.tp(), 2);
  EXPECT_EQ(p.pp(), 1);
  EXPECT_EQ(p.dp(), 2);
  ASSERT_EQ(p.rank_slot_size(), 4);
  EXPECT_EQ(p.rank_slot(2), 1);
  ASSERT_EQ(p.slots_size(), 4);
  EXPECT_EQ(p.slots(1).state(), St::lost);
  EXPECT_TRUE(p.slots(2).ready());
  EXPECT_FALSE(p.slots(3).ready());
  EXPECT_STREQ(JobMembership::state_name(p.slots(3).state()), "standby");
}

}  // namespace
}  // namespace keel
