// keel-bench control-plane at its smallest (bench/control_plane_sim.h): 64 fake ranks on 8
// slots and a standby against the real controller and a real etcd. Every agent must register
// with the controller, the loss of a slot must move its ranks to the standby in the next
// epoch's Rebuild, and every figure must be there and sane.
#include <gtest/gtest.h>

#include "bench/control_plane_fakes.h"
#include "bench/control_plane_sim.h"
#include "test_paths.h"

namespace keel::bench {
namespace {

TEST(ControlPlaneSim, SixtyFourRanksRegisterLoseASlotAndRebuildOnTheStandby) {
  ControlPlaneOptions o;
  o.per_slot = 8;
  o.standby = 1;
  o.steady_s = 1;
  o.keel_launch = test::bin_dir() + "/keel-launch";
  o.config = test::source_dir() + "/examples/configs/tiny-gpt.pbtxt";
  o.work_dir = test::temp_dir("control-plane");
  o.quiet = true;
  const ControlPlaneRow r = run_control_plane_size(o, 64);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.slots, 9);
  // Every agent was back with the new leader within the slot timeout (the takeover lost none,
  // or the row would carry an error), and the Rebuild put slot 4's ranks on slot 8.
  EXPECT_GT(r.register_s, 0);
  EXPECT_TRUE(r.rebuild_ok);
  EXPECT_EQ(r.incidents, 1);
  // The controller works, but a 64-rank job is far from a core.
  EXPECT_GT(r.cpu_per_s, 0);
  EXPECT_LT(r.cpu_per_s, 0.5);
  // 64 ranks every 200 ms and 9 agents every 200 ms: 365 messages/s. Never more (the fakes
  // send no burst after falling behind); less on a machine too busy to keep the pace (the
  // suite runs two tests at once on two cores), so no lower bound but some.
  EXPECT_GT(r.msgs_per_s, 0);
  EXPECT_LT(r.msgs_per_s, 400);
  // The controller answers every heartbeat.
  EXPECT_GT(r.ctl_kb_per_s, 0);
  // A closed connection is lost after a 150 ms grace (agent_host_liveness.cc, kReopenGrace).
  EXPECT_GE(r.detect_s, 0.15);
  EXPECT_LT(r.detect_s, 3);
  EXPECT_GE(r.rebuild_s, r.detect_s);
  EXPECT_LT(r.rebuild_s, 20);
  // At least the 56 surviving ranks' acks, the 64 restored keys and the controller's own.
  EXPECT_GE(r.etcd_writes, 56 + 64 + r.ctl_etcd_writes);
  EXPECT_GT(r.ctl_etcd_writes, 0);
  EXPECT_GT(r.etcd_bytes, r.etcd_writes);
  EXPECT_GT(r.etcd_reads, 0);
  EXPECT_LT(r.failover_s, 0);  // not asked for: not measured
}

TEST(ControlPlaneSim, ASizeThatCannotRunSaysWhy) {
  ControlPlaneOptions o;
  o.keel_launch = test::bin_dir() + "/keel-launch";
  o.config = test::source_dir() + "/examples/configs/tiny-gpt.pbtxt";
  o.work_dir = test::temp_dir("control-plane-bad");
  o.quiet = true;
  const ControlPlaneRow r = run_control_plane_size(o, 12);  // not a multiple of 8
  EXPECT_NE(r.error.find("12 ranks"), std::string::npos) << r.error;
  EXPECT_LT(r.cpu_per_s, 0);
}

}  // namespace
}  // namespace keel::bench
