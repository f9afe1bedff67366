// The ETTR projection (robust/ettr_projection.h) against cases computed by hand.
#include "robust/ettr_projection.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

namespace keel {
namespace {

// 10 machines, MTBF 100 h: rate = 10 / 100 h = 0.1 per hour = 1/36000 per second.
// Measured hot_swap costs: detect 10 s, rebuild 20 s, restore 20 s (state_bytes equal to
// state_gb, so not scaled), 0 steps thrown away; step 20 s, so lost = (0 + 0.5) × 20 = 10 s.
// Cost per incident = 10 + 20 + 20 + 10 = 60 s.
// ETTR = 1 / (1 + 60/36000) = 1 / (1 + 1/600) = 600/601 = 0.99833611...
// Failures per day = 0.1 × 24 = 2.4.
ProjectionInput hand_case() {
  ProjectionInput in;
  in.machines = 10;
  in.mtbf_hours = 100;
  in.step_s = 20;
  in.state_gb = 2;
  MeasuredCosts m;
  m.policy = ProjectedPolicy::kHotSwap;
  m.incidents = 3;
  m.detect_s = 10;
  m.rebuild_s = 20;
  m.restore_s = 20;
  m.steps_lost = 0;
  m.state_bytes = 2e9;
  in.measured[ProjectedPolicy::kHotSwap] = m;
  return in;
}

TEST(EttrProjection, SmallCaseByHand) {
  const ProjectionInput in = hand_case();
  EXPECT_DOUBLE_EQ(failure_rate_per_s(in), 1.0 / 36000.0);
  const PolicyProjection r = project(in, ProjectedPolicy::kHotSwap);
  EXPECT_DOUBLE_EQ(r.failures_per_day, 2.4);
  EXPECT_DOUBLE_EQ(r.cost.detect_s, 10);
  EXPECT_DOUBLE_EQ(r.cost.rebuild_s, 20);
  EXPECT_DOUBLE_EQ(r.cost.restore_s, 20);
  EXPECT_DOUBLE_EQ(r.cost.lost_s, 10);
  EXPECT_DOUBLE_EQ(r.cost.wait_s, 0);
  EXPECT_DOUBLE_EQ(r.cost.total(), 60);
  EXPECT_NEAR(r.ettr, 600.0 / 601.0, 1e-12);
  EXPECT_NEAR(r.ettr, 0.998336106, 1e-9);
  EXPECT_EQ(r.cost.source, "measured (3 incidents)");
}

// Restore grows with the state: measured 20 s for 2e9 bytes; at 8 GB per rank the 6e9 bytes
// more cross the 100 Gbit/s link in 6e9 × 8 / 1e11 = 0.48 s: 20.48 s. A smaller state than
// measured keeps the measured time (its fixed part does not shrink).
TEST(EttrProjection, RestoreGrowsWithState) {
  ProjectionInput in = hand_case();
  in.state_gb = 8;
  in.link_gbps = 100;
  EXPECT_NEAR(incident_cost(in, ProjectedPolicy::kHotSwap).restore_s, 20.48, 1e-9);
  in.state_gb = 0.5;
  EXPECT_DOUBLE_EQ(incident_cost(in, ProjectedPolicy::kHotSwap).restore_s, 20);
}

// Without a report: 12.5 GB over 100 Gbit/s = 100 Gbit / 100 Gbit/s = 1 s restore; detect 10 s;
// hot_swap rebuild 15 s; lost 0.5 × 2 s = 1 s: 27 s. restart_all with a checkpoint every 100
// steps: lost (50 + 0.5) × 2 = 101 s, rebuild 300 s, checkpoint read 1 s, detect 10: 412 s.
TEST(EttrProjection, DefaultsByHand) {
  ProjectionInput in;
  in.machines = 10;
  in.mtbf_hours = 100;
  in.step_s = 2;
  in.state_gb = 12.5;
  in.link_gbps = 100;
  in.checkpoint_every_steps = 100;
  const IncidentCost hot = incident_cost(in, ProjectedPolicy::kHotSwap);
  EXPECT_DOUBLE_EQ(hot.restore_s, 1);
  EXPECT_DOUBLE_EQ(hot.total(), 27);
  EXPECT_EQ(hot.source, "defaults");
  const IncidentCost all = incident_cost(in, ProjectedPolicy::kRestartAll);
  EXPECT_DOUBLE_EQ(all.lost_s, 101);
  EXPECT_DOUBLE_EQ(all.total(), 412);
  // No interval given: 30 minutes of 2 s steps = 900 steps.
  in.checkpoint_every_steps = 0;
  EXPECT_EQ(checkpoint_interval_steps(in), 900);
}

// 10 machines, MTBF 100 h, repair 10 h: machines in repair ~ Poisson(0.1/h × 10 h = 1).
// K = 1: P[X >= 1] = 1 − e^-1 = 0.63212; the wait is 10 h / 2 = 18000 s; expected 11378.2 s.
// K = 0: every failure waits a whole repair, 36000 s. in_place needs no standby.
TEST(EttrProjection, StandbyWaitByHand) {
  ProjectionInput in = hand_case();
  in.repair_hours = 10;
  in.standbys = 1;
  EXPECT_NEAR(poisson_at_least(1.0, 1), 1 - std::exp(-1.0), 1e-12);
  EXPECT_NEAR(poisson_at_least(1.0, 2), 1 - 2 * std::exp(-1.0), 1e-12);
  EXPECT_NEAR(incident_cost(in, ProjectedPolicy::kHotSwap).wait_s, (1 - std::exp(-1.0)) * 18000.0,
              1e-6);
  EXPECT_NEAR(project(in, ProjectedPolicy::kHotSwap).p_no_standby, 1 - std::exp(-1.0), 1e-12);
  EXPECT_DOUBLE_EQ(incident_cost(in, ProjectedPolicy::kInPlace).wait_s, 0);
  in.standbys = 0;
  EXPECT_DOUBLE_EQ(incident_cost(in, ProjectedPolicy::kHotSwap).wait_s, 36000);
  // More standbys never wait longer.
  double last = 1e300;
  for (int k = 0; k <= 8; ++k) {
    in.standbys = k;
    const double w = incident_cost(in, ProjectedPolicy::kHotSwap).wait_s;
    EXPECT_LE(w, last) << k;
    last = w;
  }
}

TEST(EttrProjection, MonotonicInMachinesAndMtbf) {
  ProjectionInput in = hand_case();
  for (const auto p :
       {ProjectedPolicy::kHotSwap, ProjectedPolicy::kInPlace, ProjectedPolicy::kRestartAll}) {
    double last = 2;
    for (int machines : {1, 10, 100, 1200, 1250, 5000}) {
      in.machines = machines;
      const double e = project(in, p).ettr;
      EXPECT_LT(e, last) << projected_policy_name(p) << " " << machines;
      EXPECT_GT(e, 0);
      last = e;
    }
    in.machines = 1250;
    last = 0;
    for (double mtbf : {10.0, 100.0, 1000.0, 10000.0, 100000.0}) {
      in.mtbf_hours = mtbf;
      const double e = project(in, p).ettr;
      EXPECT_GT(e, last) << projected_policy_name(p) << " " << mtbf;
      EXPECT_LT(e, 1);
      last = e;
    }
    in.mtbf_hours = 100;
  }
}

// The same measured numbers for both: restart_all also throws away half a checkpoint interval.
TEST(EttrProjection, RestartAllWorseThanHotSwapWithSameMeasurements) {
  ProjectionInput in = hand_case();
  MeasuredCosts m = in.measured[ProjectedPolicy::kHotSwap];
  m.policy = ProjectedPolicy::kRestartAll;
  in.measured[ProjectedPolicy::kRestartAll] = m;
  in.checkpoint_every_steps = 10;
  const PolicyProjection hot = project(in, ProjectedPolicy::kHotSwap);
  const PolicyProjection all = project(in, ProjectedPolicy::kRestartAll);
  EXPECT_DOUBLE_EQ(all.cost.detect_s, hot.cost.detect_s);
  EXPECT_DOUBLE_EQ(all.cost.lost_s, (5 + 0.5) * 20);
  EXPECT_LT(all.ettr, hot.ettr);
}

// Three recovered incidents (medians: detect {0.5, 0.3, 0.7} → 0.5, rebuild {1.0, 0.7, 1.8} →
// 1.0, restore {0.5, 0.2, 1.0} → 0.5, steps lost {1, 0, 2} → 1), a warning without a restore
// (skipped), and a field this build does not know (ignored).
constexpr const char* kReport = R"({
  "recovery_mode": "hot_swap",
  "snapshot_bytes": 1000000,
  "a_field_from_the_future": {"x": 1},
  "incidents": [
    {"kind": "crash", "injected_at": 100.0, "detected_at": 100.5, "rebuilt_at": 101.5,
     "restored_at": 102.0, "steps_lost": 1},
    {"kind": "slot_loss", "injected_at": 200.0, "detected_at": 200.3, "rebuilt_at": 201.0,
     "restored_at": 201.2, "steps_lost": 0},
    {"kind": "hang", "injected_at": 300.0, "detected_at": 300.7, "rebuilt_at": 302.5,
     "restored_at": 303.5, "steps_lost": 2},
    {"kind": "slow", "detected_at": 400.0}
  ]
})";

TEST(EttrProjection, ParsesReportIntoPhaseMedians) {
  const MeasuredCosts m = measured_costs_from_json(kReport);
  EXPECT_EQ(m.policy, ProjectedPolicy::kHotSwap);
  EXPECT_EQ(m.incidents, 3);
  EXPECT_NEAR(m.detect_s, 0.5, 1e-9);
  EXPECT_NEAR(m.rebuild_s, 1.0, 1e-9);
  EXPECT_NEAR(m.restore_s, 0.5, 1e-9);
  EXPECT_DOUBLE_EQ(m.steps_lost, 1);
  EXPECT_DOUBLE_EQ(m.state_bytes, 1e6);

  // Into the model: 1 GB per rank is 999e6 bytes more than measured, 999e6 × 8 / 1e11 =
  // 0.07992 s over 100 Gbit/s, so restore 0.5 + 0.07992 = 0.57992 s; lost (1 + 0.5) × 2 s =
  // 3 s; total 0.5 + 1 + 0.57992 + 3 = 5.07992 s.
  ProjectionInput in;
  in.machines = 10;
  in.mtbf_hours = 100;
  in.step_s = 2;
  in.state_gb = 1;
  in.link_gbps = 100;
  in.measured[m.policy] = m;
  const IncidentCost c = incident_cost(in, ProjectedPolicy::kHotSwap);
  EXPECT_NEAR(c.restore_s, 0.57992, 1e-9);
  EXPECT_NEAR(c.total(), 5.07992, 1e-9);
}

TEST(EttrProjection, RejectsWhatIsNotAUsableReport) {
  EXPECT_THROW(measured_costs_from_json("{not json"), std::invalid_argument);
  EXPECT_THROW(measured_costs_from_json(R"({"recovery_mode": "bogus"})"), std::invalid_argument);
  EXPECT_THROW(measured_costs_from_json(R"({"recovery_mode": "in_place", "incidents": []})"),
               std::invalid_argument);
}

}  // namespace
}  // namespace keel
