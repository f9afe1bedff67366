// keel-bench's report pieces: the Poisson fault draw (bench/fault_draw.h), the lost-time split
// (bench/bench_report.h) and the page (bench/report_html.h), on hand-made reports.
#include <gtest/gtest.h>

#include "bench/bench_report.h"
#include "bench/fault_draw.h"
#include "bench/report_html.h"

namespace keel::bench {
namespace {

TEST(FaultDraw, SeededStepsInRangeAndRateAsAsked) {
  const auto a = draw_schedule(10, 0.01, 100000, 8, {"crash", "hang"}, 7);
  const auto b = draw_schedule(10, 0.01, 100000, 8, {"crash", "hang"}, 7);
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
  EXPECT_NE(a.SerializeAsString(),
            draw_schedule(10, 0.01, 100000, 8, {"crash", "hang"}, 8).SerializeAsString());
  // 1000 s of steps at one failure per 10 s: 100 expected (Poisson, sd 10).
  EXPECT_GT(a.fault_size(), 60);
  EXPECT_LT(a.fault_size(), 140);
  int64_t last = 0;
  int hangs = 0;
  for (const faults::Fault& f : a.fault()) {
    EXPECT_GT(f.step(), last);
    EXPECT_LT(f.step(), 100000);
    EXPECT_GE(f.rank(), 0);
    EXPECT_LT(f.rank(), 8);
    hangs += f.kind() == faults::Fault::hang;
    last = f.step();
  }
  EXPECT_GT(hangs, 0);
  EXPECT_LT(hangs, a.fault_size());
  EXPECT_EQ(draw_schedule(0, 0.01, 100, 8, {"crash"}, 1).fault_size(), 0);
}

TEST(LostTime, PhasesByCauseAndTheRest) {
  report::RunReport r;
  r.set_wall_s(100);
  r.set_productive_s(80);
  report::Incident* inc = r.add_incidents();
  inc->set_injected_at(1000);
  inc->set_detected_at(1001);
  inc->set_evicted_at(1001.5);
  inc->set_rebuilt_at(1002);
  inc->set_restored_at(1004);
  inc->set_first_step_at(1004.25);
  inc->set_steps_lost(3);
  report::Incident* crash = r.add_incidents();  // in place: no eviction, no injection time
  crash->set_detected_at(2000);
  crash->set_rebuilt_at(2001);
  crash->set_recovered_at(2003);
  r.add_ranks()->add_pids(1);
  r.mutable_ranks(0)->add_pids(2);
  r.add_ranks()->add_pids(3);
  const LostTime t = lost_time(r, 0.5);
  EXPECT_DOUBLE_EQ(t.detection(), 1);
  EXPECT_DOUBLE_EQ(t.eviction(), 0.5);
  EXPECT_DOUBLE_EQ(t.rebuild(), 0.5 + 1);
  EXPECT_DOUBLE_EQ(t.restore(), 2 + 2);
  EXPECT_DOUBLE_EQ(t.first_step(), 0.25);
  EXPECT_DOUBLE_EQ(t.lost_steps(), 1.5);
  EXPECT_DOUBLE_EQ(t.other(), 20 - (1 + 0.5 + 1.5 + 4 + 0.25 + 1.5));
  EXPECT_EQ(t.restarts(), 1);
}

TEST(MakeRun, ChecksumAgainstTheReferenceAndStepRates) {
  report::RunReport r;
  r.set_param_checksum("abc");
  r.set_steps_completed(3);
  r.set_tokens_per_s(100);
  r.set_mfu(0.5);
  for (double t : {1.0, 2.0, 4.0}) r.add_step_end_s(t);
  for (double l : {3.0, 2.0, 1.0}) r.add_losses(l);
  const BenchRun same = make_run("hot_swap", "hot_swap", 0, r, 1, 100, "abc");
  EXPECT_TRUE(same.ok());
  EXPECT_TRUE(same.bitwise_equal());
  EXPECT_FALSE(make_run("x", "in_place", 0, r, 1, 100, "abd").bitwise_equal());
  EXPECT_FALSE(make_run("x", "in_place", 3, r, 1, 100, "abc").ok());
  ASSERT_EQ(same.step_tokens_per_s_size(), 3);
  EXPECT_DOUBLE_EQ(same.step_tokens_per_s(0), 100);  // takes the second step's
  EXPECT_DOUBLE_EQ(same.step_tokens_per_s(2), 50);   // 100 tokens in 2 s
  EXPECT_DOUBLE_EQ(same.step_mfu(2), 0.25);
}

TEST(ReportHtml, EscapesTextAndFetchesNothing) {
  BenchReport rep;
  rep.set_config("a<b>&\"c\".pbtxt");
  BenchRun* run = rep.add_runs();
  run->set_name("fault_free");
  run->set_ettr(0.9);
  report::Incident* inc = run->add_incidents();
  inc->set_kind("exit");
  inc->set_action("restart <rank> & more");
  inc->set_injected_at(10);
  inc->set_detected_at(11);
  const std::string h = report_html(rep);
  EXPECT_NE(h.find("a&lt;b&gt;&amp;&quot;c&quot;.pbtxt"), std::string::npos);
  EXPECT_EQ(h.find("<rank>"), std::string::npos);
  EXPECT_EQ(h.find("http"), std::string::npos);
  EXPECT_EQ(h.find("<script"), std::string::npos);
  size_t svgs = 0;
  for (size_t at = h.find("<svg"); at != std::string::npos; at = h.find("<svg", at + 1)) ++svgs;
  EXPECT_EQ(svgs, 4u);
}

}  // namespace
}  // namespace keel::bench
