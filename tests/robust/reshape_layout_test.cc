// Which layout a job takes when it runs out of machines (robust/reshape_layout.h).
#include "robust/reshape_layout.h"

#include <gtest/gtest.h>

namespace keel::policy {
namespace {

// The tiny GPT: 4 heads, 2 layers (tp divides 4, pp <= 2).
std::string tiny_gpt(const Topology& t) {
  if (4 % t.tp() != 0) return "parallel.tp must divide model.num_heads = 4";
  if (t.pp() > 2) return "parallel.pp must be <= model.num_layers = 2";
  return "";
}

ReshapeRequest request(Topology configured, int live_slots, int wps = 1) {
  ReshapeRequest r;
  r.configured = configured;
  r.live_slots = live_slots;
  r.workers_per_slot = wps;
  r.micro_batch = 4;
  r.global_batch = 16;
  r.invalid = tiny_gpt;
  return r;
}

Topology chosen(const ReshapeRequest& r) {
  std::string why;
  auto c = choose_reshape(r, &why);
  EXPECT_TRUE(c.has_value()) << why;
  return c ? c->topo : Topology(0, 0, 0);
}

TEST(ReshapeLayout, ADataParallelOneJobThatLostASlotKeepsTrainingOnFewerRanks) {
  // TP2xPP2xDP1 on 4 slots, one lost: 3 ranks cannot hold TP2xPP2; the most ranks that fit
  // the model and the batch are 2, and TP2 is kept.
  const Topology t = chosen(request(Topology(2, 2, 1), 3));
  EXPECT_EQ(t.world_size(), 2);
  EXPECT_EQ(t.tp(), 2);
  EXPECT_EQ(t.pp(), 1);
}

TEST(ReshapeLayout, WholeSlotsAndTheGlobalBatchDecide) {
  // 8 ranks configured on 4 slots of 2; 3 slots left: 6 ranks would need dp 3 or pp 3,
  // neither fits (16 % (4·3) != 0, 2 layers), so 4 ranks on 2 slots, the model still split
  // four ways (TP2xPP2, as configured, rather than TP4 or more replicas).
  std::string why;
  auto c = choose_reshape(request(Topology(2, 2, 2), 3, 2), &why);
  ASSERT_TRUE(c) << why;
  EXPECT_EQ(c->topo.world_size(), 4);
  EXPECT_EQ(c->slots, 2);
  EXPECT_EQ(c->topo.tp(), 2);
  EXPECT_EQ(c->topo.pp(), 2);
  EXPECT_NE(c->why.find("TP2xPP2xDP1 on 2 of 3 slot(s)"), std::string::npos) << c->why;
  EXPECT_NE(c->why.find("4 micro-batch(es) per replica"), std::string::npos) << c->why;
}

TEST(ReshapeLayout, ItGrowsBackToTheConfiguredLayoutAndNeverPast) {
  std::string why;
  auto c = choose_reshape(request(Topology(2, 2, 2), 8, 2), &why);
  ASSERT_TRUE(c) << why;
  EXPECT_EQ(c->topo.tp(), 2);
  EXPECT_EQ(c->topo.pp(), 2);
  EXPECT_EQ(c->topo.dp(), 2);
  EXPECT_EQ(c->slots, 4);
  EXPECT_NE(c->why.find("the configured layout"), std::string::npos) << c->why;
}

TEST(ReshapeLayout, EachRanksShareStaysAsSmallAsItCan) {
  // TP1xPP2xDP2 on 4 slots, 2 left: the model stays split in two (the pipeline kept) rather
  // than two replicas that each hold all of it.
  const Topology t = chosen(request(Topology(1, 2, 2), 2, 1));
  EXPECT_EQ(t.world_size(), 2);
  EXPECT_EQ(t.tp(), 1);
  EXPECT_EQ(t.pp(), 2);
  EXPECT_EQ(t.dp(), 1);
}

TEST(ReshapeLayout, NothingFitsSaysWhy) {
  ReshapeRequest r = request(Topology(2, 2, 1), 1, 1);
  r.invalid = [](const Topology&) { return std::string("the model needs tp 2"); };
  std::string why;
  EXPECT_FALSE(choose_reshape(r, &why));
  EXPECT_NE(why.find("at most 1 rank(s)"), std::string::npos) << why;
  EXPECT_NE(why.find("the model needs tp 2"), std::string::npos) << why;
  // No live slot at all.
  EXPECT_FALSE(choose_reshape(request(Topology(2, 2, 1), 0), &why));
}

}  // namespace
}  // namespace keel::policy
