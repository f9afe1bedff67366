// AppliedMembership (launcher/worker/applied_membership.h): the layout a worker takes from
// its epoch's Rebuild, the config's parallel.dp following it, the ranks a slot holds, and the
// refusal of a Membership that cannot be the job's.
#include "launcher/worker/applied_membership.h"

#include <gtest/gtest.h>

#include "runtime/check.h"

namespace keel {
namespace {

config::JobConfig config(int tp, int pp, int dp) {
  config::JobConfig c;
  c.mutable_parallel()->set_tp(tp);
  c.mutable_parallel()->set_pp(pp);
  c.mutable_parallel()->set_dp(dp);
  return c;
}

membership::Membership layout(int tp, int pp, int dp, std::vector<int> rank_slot = {}) {
  membership::Membership m;
  m.set_tp(tp);
  m.set_pp(pp);
  m.set_dp(dp);
  for (int s : rank_slot) m.add_rank_slot(s);
  return m;
}

TEST(AppliedMembership, StartsFromTheConfigAndFollowsTheRebuild) {
  config::JobConfig cfg = config(2, 1, 3);
  AppliedMembership a;
  a.apply(AppliedMembership::from_config(cfg), &cfg);
  EXPECT_EQ(a.topo().world_size(), 6);
  EXPECT_TRUE(a.ranks_on_slot(0).empty());  // no placement without slots

  // The job shrank to two replicas: the layout, the placement and the config's dp follow.
  a.apply(layout(2, 1, 2, {4, 4, 7, 7}), &cfg);
  EXPECT_EQ(a.topo().dp(), 2);
  EXPECT_EQ(a.topo().world_size(), 4);
  EXPECT_EQ(cfg.parallel().dp(), 2);
  EXPECT_EQ(a.ranks_on_slot(7), (std::vector<int>{2, 3}));
  EXPECT_EQ(a.ranks_on_slot(5), std::vector<int>{});
  EXPECT_EQ(a.membership().rank_slot_size(), 4);
}

TEST(AppliedMembership, AReshapeChangesEveryParallelism) {
  config::JobConfig cfg = config(2, 2, 1);
  AppliedMembership a;
  a.apply(AppliedMembership::from_config(cfg), &cfg);
  a.apply(layout(2, 1, 1, {0, 0}), &cfg);  // recovery.on_no_standby = reshape
  EXPECT_EQ(a.topo().world_size(), 2);
  EXPECT_EQ(cfg.parallel().tp(), 2);
  EXPECT_EQ(cfg.parallel().pp(), 1);
  EXPECT_EQ(cfg.parallel().dp(), 1);
}

TEST(AppliedMembership, RefusesALayoutThatCannotBeTheJobs) {
  config::JobConfig cfg = config(2, 1, 2);
  AppliedMembership a;
  a.apply(AppliedMembership::from_config(cfg), &cfg);
  cfg.mutable_parallel()->add_stage_layers(2);
  EXPECT_THROW(a.apply(layout(2, 2, 1), &cfg), Error);  // stage_layers fixes pp
  cfg.mutable_parallel()->clear_stage_layers();
  EXPECT_THROW(a.apply(layout(2, 1, 0), &cfg), Error);          // no replica
  EXPECT_THROW(a.apply(layout(2, 1, 2, {0, 1}), &cfg), Error);  // two ranks unplaced
  // Refused: nothing changed.
  EXPECT_EQ(a.topo().world_size(), 4);
  EXPECT_EQ(cfg.parallel().dp(), 2);
}

}  // namespace
}  // namespace keel
