// 1F1B schedules: shape against hand-worked cases, and a simulation of all stages together
// that checks every send meets its receive in order and nothing deadlocks.
#include "parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <deque>

#include "runtime/check.h"

namespace keel {
namespace {

TEST(PipelineSchedule, HandWorkedFourStagesSixMicroBatches) {
  // Megatron's 1F1B: stage p warms up with P-p-1 forwards.
  EXPECT_EQ(to_string(one_f_one_b(0, 4, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(to_string(one_f_one_b(1, 4, 6)), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(to_string(one_f_one_b(3, 4, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  EXPECT_EQ(to_string(one_f_one_b(0, 1, 3)), "F0 B0 F1 B1 F2 B2");
}

TEST(PipelineSchedule, FewerMicroBatchesThanStages) {
  EXPECT_EQ(to_string(one_f_one_b(0, 4, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(max_in_flight(0, 4, 2), 2);
  EXPECT_EQ(max_in_flight(0, 4, 8), 4);
  EXPECT_EQ(max_in_flight(3, 4, 8), 1);
  EXPECT_THROW(one_f_one_b(0, 2, 0), InputError);
}

TEST(PipelineSchedule, InFlightNeverExceedsBound) {
  for (int P = 1; P <= 5; ++P)
    for (int M = 1; M <= 9; ++M)
      for (int p = 0; p < P; ++p) {
        int live = 0, peak = 0;
        for (const auto& a : one_f_one_b(p, P, M)) {
          live += a.kind == PipelineAction::kForward ? 1 : -1;
          peak = std::max(peak, live);
        }
        EXPECT_EQ(live, 0);
        EXPECT_EQ(peak, max_in_flight(p, P, M)) << "P=" << P << " M=" << M << " p=" << p;
      }
}

// Runs all stages as coroutines over FIFO links. A fused action sends and receives in one
// call: it may proceed once its send is queued and the receive is available. Blocked stages
// wait; if no stage can move the schedule deadlocks.
void simulate(int P, int M) {
  std::vector<std::vector<PipelineAction>> plan(P);
  for (int p = 0; p < P; ++p) plan[p] = one_f_one_b(p, P, M);
  // fwd[p]: activations from p to p+1 (micro-batch ids); bwd[p]: gradients from p+1 to p.
  std::vector<std::deque<int>> fwd(P), bwd(P);
  std::vector<size_t> pc(P, 0);
  std::vector<bool> pre_received(P, false);
  std::vector<int> fwd_done(P, 0), bwd_done(P, 0);
  bool moved = true;
  while (moved) {
    moved = false;
    for (int p = 0; p < P; ++p) {
      if (pc[p] >= plan[p].size()) continue;
      const PipelineAction& a = plan[p][pc[p]];
      // Receive before compute.
      if (!pre_received[p]) {
        if (a.kind == PipelineAction::kForward && a.recv_input) {
          if (fwd[p - 1].empty()) continue;
          ASSERT_EQ(fwd[p - 1].front(), a.micro_batch);
          fwd[p - 1].pop_front();
        }
        if (a.kind == PipelineAction::kBackward && a.recv_grad) {
          if (bwd[p].empty()) continue;
          ASSERT_EQ(bwd[p].front(), a.micro_batch);
          bwd[p].pop_front();
        }
      }
      pre_received[p] = false;
      if (a.kind == PipelineAction::kForward) {
        ASSERT_EQ(a.micro_batch, fwd_done[p]++);
        if (a.send_output) fwd[p].push_back(a.micro_batch);
      } else {
        ASSERT_EQ(a.micro_batch, bwd_done[p]++);
        if (a.send_grad) bwd[p - 1].push_back(a.micro_batch);
      }
      if (a.fused_with_next) {
        // The next action's receive is part of this call: it must be satisfiable without
        // this stage doing anything else. Modelled by letting the next action skip its
        // receive once the message is there; other stages keep moving meanwhile.
        const PipelineAction& n = plan[p][pc[p] + 1];
        ASSERT_TRUE((n.kind == PipelineAction::kBackward && n.recv_grad) ||
                    (n.kind == PipelineAction::kForward && n.recv_input));
      }
      ++pc[p];
      moved = true;
    }
  }
  for (int p = 0; p < P; ++p) {
    EXPECT_EQ(pc[p], plan[p].size()) << "stage " << p << " stuck (P=" << P << ", M=" << M << ")";
    EXPECT_TRUE(fwd[p].empty() && bwd[p].empty());
  }
}

TEST(PipelineSchedule, AllStagesTogetherNeverDeadlock) {
  for (int P = 1; P <= 5; ++P)
    for (int M = 1; M <= 8; ++M) simulate(P, M);
}

}  // namespace
}  // namespace keel
