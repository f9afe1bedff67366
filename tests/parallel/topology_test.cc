// parallel/topology.h against layouts worked out by hand from rank = tp + dp·TP + pp·TP·DP.
#include "parallel/topology.h"

#include <gtest/gtest.h>

#include <set>

#include "runtime/check.h"

namespace keel {
namespace {

using Group = std::vector<int>;

TEST(Topology, TwoByTwoByTwoRankFive) {
  Topology t(/*tp=*/2, /*pp=*/2, /*dp=*/2);
  EXPECT_EQ(t.world_size(), 8);
  // 5 = 1 (tp) + 0·2 (dp) + 1·4 (pp)
  EXPECT_EQ(t.coord(5), (Coord{.dp = 0, .pp = 1, .tp = 1}));
  EXPECT_EQ(t.rank({.dp = 0, .pp = 1, .tp = 1}), 5);
  EXPECT_EQ(t.tp_group(5), (Group{4, 5}));
  EXPECT_EQ(t.pp_group(5), (Group{1, 5}));
  EXPECT_EQ(t.dp_group(5), (Group{5, 7}));
  EXPECT_EQ(t.embedding_group(5), (Group{1, 5}));
  EXPECT_EQ(t.tp_group_name(5), "tp.dp0.pp1");
  EXPECT_EQ(t.pp_group_name(5), "pp.dp0.tp1");
  EXPECT_EQ(t.dp_group_name(5), "dp.pp1.tp1");
  EXPECT_EQ(t.embedding_group_name(5), "emb.dp0.tp1");
  // 2 = 0 + 1·2 + 0·4
  EXPECT_EQ(t.coord(2), (Coord{.dp = 1, .pp = 0, .tp = 0}));
  EXPECT_EQ(t.dp_group(2), (Group{0, 2}));
  EXPECT_EQ(t.pp_group(2), (Group{2, 6}));
}

TEST(Topology, FourByThreeByTwoRankThirteen) {
  Topology t(/*tp=*/4, /*pp=*/3, /*dp=*/2);
  EXPECT_EQ(t.world_size(), 24);
  // 13 = 1 + 1·4 + 1·8
  EXPECT_EQ(t.coord(13), (Coord{.dp = 1, .pp = 1, .tp = 1}));
  EXPECT_EQ(t.tp_group(13), (Group{12, 13, 14, 15}));
  EXPECT_EQ(t.pp_group(13), (Group{5, 13, 21}));
  EXPECT_EQ(t.dp_group(13), (Group{9, 13}));
  // First and last stage only, not the middle one.
  EXPECT_EQ(t.embedding_group(13), (Group{5, 21}));
  // 23 = 3 + 1·4 + 2·8
  EXPECT_EQ(t.coord(23), (Coord{.dp = 1, .pp = 2, .tp = 3}));
  EXPECT_EQ(t.embedding_group(23), (Group{7, 23}));
}

TEST(Topology, SingleStageEmbeddingGroupIsTheRankItself) {
  Topology t(/*tp=*/2, /*pp=*/1, /*dp=*/3);
  EXPECT_EQ(t.coord(3), (Coord{.dp = 1, .pp = 0, .tp = 1}));
  EXPECT_EQ(t.embedding_group(3), (Group{3}));
  EXPECT_EQ(t.pp_group(3), (Group{3}));
  EXPECT_EQ(t.dp_group(3), (Group{1, 3, 5}));
}

// Every axis partitions the world, and a rank's index in its group is its coordinate.
TEST(Topology, GroupsPartitionTheWorld) {
  Topology t(/*tp=*/3, /*pp=*/2, /*dp=*/4);
  std::set<Group> tp, pp, dp;
  for (int r = 0; r < t.world_size(); ++r) {
    Coord c = t.coord(r);
    EXPECT_EQ(t.rank(c), r);
    EXPECT_EQ(t.tp_group(r).at(c.tp), r);
    EXPECT_EQ(t.pp_group(r).at(c.pp), r);
    EXPECT_EQ(t.dp_group(r).at(c.dp), r);
    tp.insert(t.tp_group(r));
    pp.insert(t.pp_group(r));
    dp.insert(t.dp_group(r));
  }
  EXPECT_EQ(tp.size(), 8u);   // pp·dp groups of 3
  EXPECT_EQ(pp.size(), 12u);  // tp·dp groups of 2
  EXPECT_EQ(dp.size(), 6u);   // tp·pp groups of 4
  std::multiset<int> seen;
  for (const auto& g : dp) seen.insert(g.begin(), g.end());
  EXPECT_EQ(seen.size(), 24u);
  EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), 24u);
}

TEST(Topology, RejectsBadSizesAndRanks) {
  EXPECT_THROW(Topology(0, 1, 1), InputError);
  EXPECT_THROW(Topology(1, -2, 1), InputError);
  Topology t(2, 1, 1);
  EXPECT_THROW(t.coord(2), Error);
  EXPECT_THROW(t.coord(-1), Error);
}

}  // namespace
}  // namespace keel
