// Backup placement over every layout with tp, pp, dp in 1..4.
#include "ckpt/backup_placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "test_expect.h"

namespace keel {
namespace {

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

TEST(BackupPlacement, EveryLayoutUpToFour) {
  int layouts = 0;
  for (int tp = 1; tp <= 4; ++tp)
    for (int pp = 1; pp <= 4; ++pp)
      for (int dp = 1; dp <= 4; ++dp) {
        ++layouts;
        Topology topo(tp, pp, dp);
        SCOPED_TRACE(testing::Message() << "tp=" << tp << " pp=" << pp << " dp=" << dp);
        const int world = topo.world_size();
        const int big = (tp > 1) + (pp > 1) + (dp > 1);
        std::set<int> holders;
        for (int r = 0; r < world; ++r) {
          BackupPlacement b = backup_holder(topo, r);
          if (world == 1) {
            EXPECT_EQ(b.holder, -1);
            EXPECT_HAS(b.rule, "no peer");
            EXPECT_EQ(backup_owner(topo, r), -1);
            continue;
          }
          ASSERT_GE(b.holder, 0);
          ASSERT_LT(b.holder, world);
          EXPECT_NE(b.holder, r);
          EXPECT_EQ(backup_owner(topo, b.holder), r);
          holders.insert(b.holder);
          const bool in_tp = contains(topo.tp_group(r), b.holder);
          const bool in_pp = contains(topo.pp_group(r), b.holder);
          const bool in_dp = contains(topo.dp_group(r), b.holder);
          if (big >= 2) {
            EXPECT_FALSE(in_tp || in_pp || in_dp) << "rank " << r << " -> " << b.holder;
          } else if (tp > 1) {
            EXPECT_TRUE(in_tp);
            EXPECT_HAS(b.rule, "shares the TP group");
          } else if (pp > 1) {
            EXPECT_TRUE(in_pp);
            EXPECT_HAS(b.rule, "shares the PP group");
          } else {
            EXPECT_TRUE(in_dp);
            EXPECT_HAS(b.rule, "shares the DP group");
          }
          if (dp > 1 && pp > 1) {
            EXPECT_HAS(b.rule, "default");
          }
        }
        if (world > 1) {
          EXPECT_EQ(static_cast<int>(holders.size()), world) << "not a bijection";
        }
      }
  EXPECT_EQ(layouts, 64);
}

TEST(BackupPlacement, DefaultRuleCoordinates) {
  Topology topo(2, 3, 4);
  for (int r = 0; r < topo.world_size(); ++r) {
    Coord c = topo.coord(r);
    Coord h = topo.coord(backup_holder(topo, r).holder);
    EXPECT_EQ(h, (Coord{(c.dp + 1) % 4, (c.pp + 1) % 3, c.tp}));
  }
}

TEST(BackupPlacement, WithoutZeroOneTheNextReplicaHoldsTheBackup) {
  Topology topo(2, 3, 4);
  ASSERT_TRUE(replicas_hold_backups(topo, /*zero1=*/false));
  EXPECT_FALSE(replicas_hold_backups(topo, /*zero1=*/true));
  EXPECT_FALSE(replicas_hold_backups(Topology(2, 3, 1), false));  // no replica to hold it
  std::set<int> holders;
  for (int r = 0; r < topo.world_size(); ++r) {
    BackupPlacement b = backup_holder(topo, r, /*replicas=*/true);
    EXPECT_TRUE(b.replica);
    EXPECT_HAS(b.rule, "replica");
    Coord c = topo.coord(r);
    EXPECT_EQ(topo.coord(b.holder), (Coord{(c.dp + 1) % 4, c.pp, c.tp}));
    EXPECT_EQ(backup_owner(topo, b.holder, true), r);
    holders.insert(b.holder);
  }
  EXPECT_EQ(static_cast<int>(holders.size()), topo.world_size());
  EXPECT_FALSE(backup_holder(topo, 0).replica);
}

}  // namespace
}  // namespace keel
