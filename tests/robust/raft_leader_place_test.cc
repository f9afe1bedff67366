// Where etcd's Raft leader is kept and when it may be moved (robust/raft_leader_place.h).
#include "robust/raft_leader_place.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

// Three members on slots 0..2, all up and answering, member id = 10 + slot, leading: `leader`.
std::vector<RaftMemberView> healthy(int leader_slot) {
  std::vector<RaftMemberView> v;
  for (int s = 0; s < 3; ++s)
    v.push_back(
        RaftMemberView{uint64_t(10 + s), s, true, true, uint64_t(10 + leader_slot), 4, 100});
  return v;
}

TEST(RaftLeaderPlace, KeptOnTheHighestMemberSlotThatIsNotTheControllers) {
  EXPECT_EQ(raft_leader_home(healthy(0), 0), 2);
  EXPECT_EQ(raft_leader_home(healthy(0), 2), 1);
  // A replaced member on a higher slot (3) is the home once it runs.
  auto v = healthy(0);
  v[1].slot = 3;
  EXPECT_EQ(raft_leader_home(v, 0), 3);
  // One member, on the controller's machine: nowhere else to keep it.
  EXPECT_EQ(raft_leader_home({healthy(0)[0]}, 0), -1);
  EXPECT_EQ(raft_leader_move({healthy(0)[0]}, 0).to, 0u);
}

TEST(RaftLeaderPlace, AHealthyClusterLedFromElsewhereIsMovedHome) {
  const RaftLeaderMove m = raft_leader_move(healthy(1), 0);
  EXPECT_EQ(m.from, 11u);
  EXPECT_EQ(m.to, 12u);
  EXPECT_EQ(m.to_slot, 2);
  EXPECT_TRUE(m.why_not.empty());
  // The controller on slot 2: home is slot 1.
  EXPECT_EQ(raft_leader_move(healthy(0), 2).to, 11u);
}

TEST(RaftLeaderPlace, NoMoveWhenInPlace) {
  const RaftLeaderMove m = raft_leader_move(healthy(2), 0);
  EXPECT_EQ(m.to, 0u);
  EXPECT_EQ(m.why_not, "in place");
}

TEST(RaftLeaderPlace, NoMoveWhileAnyMemberIsDownSilentOrUnlisted) {
  // A move aimed at a dead or silent member stalls etcd's writes for an election timeout;
  // one made while any member is away could be aimed at it as it comes back.
  for (int bad = 0; bad < 3; ++bad) {
    auto down = healthy(0);
    down[bad].slot_up = false;
    EXPECT_EQ(raft_leader_move(down, 0).to, 0u) << "slot " << bad << " down";
    auto silent = healthy(0);
    silent[bad].answered = false;
    EXPECT_EQ(raft_leader_move(silent, 0).to, 0u) << "slot " << bad << " silent";
    auto unlisted = healthy(0);
    unlisted[bad].id = 0;
    EXPECT_EQ(raft_leader_move(unlisted, 0).to, 0u) << "slot " << bad << " unlisted";
  }
  auto down = healthy(0);
  down[2].slot_up = false;
  EXPECT_EQ(raft_leader_move(down, 0).why_not, "the member on slot 2 is down or silent");
}

TEST(RaftLeaderPlace, NoMoveDuringAnElection) {
  auto none = healthy(0);
  none[1].leader_id = 0;  // it knows no leader
  EXPECT_EQ(raft_leader_move(none, 0).to, 0u);
  auto split = healthy(0);
  split[2].leader_id = 11;  // it follows another
  EXPECT_EQ(raft_leader_move(split, 0).to, 0u);
  auto term = healthy(0);
  term[2].raft_term = 5;  // a newer term: an election went on
  EXPECT_EQ(raft_leader_move(term, 0).to, 0u);
  auto foreign = healthy(0);
  for (auto& m : foreign) m.leader_id = 99;  // led by a member keel does not know
  EXPECT_EQ(raft_leader_move(foreign, 0).to, 0u);
}

TEST(RaftLeaderPlace, NoMoveToAMemberBehindTheLeader) {
  auto behind = healthy(0);
  behind[2].raft_index = 100 - kRaftMoveMaxLag - 1;
  EXPECT_EQ(raft_leader_move(behind, 0).to, 0u);
  EXPECT_EQ(raft_leader_move(behind, 0).why_not, "the member on slot 2 is behind the leader");
  behind[2].raft_index = 100 - kRaftMoveMaxLag;  // a few entries: caught up in one trip
  EXPECT_EQ(raft_leader_move(behind, 0).to, 12u);
}

}  // namespace
}  // namespace keel
