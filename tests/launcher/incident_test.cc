// An incident is derived from what was found, the failure and the plan, in one function
// (launcher/controller/incident.h): who and how from the failure, what was done from the plan,
// what it cost from the transition.
#include "launcher/controller/incident.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

Detected found_crash() {
  Detected d;
  d.found.set_kind("crash");
  d.found.set_slot(1);
  d.found.set_detail("rank 3 died of signal 9");
  d.found.set_detected_at(100);
  d.failure.kind = policy::FailureKind::kCrash;
  d.failure.culprit = 3;
  d.failure.rule = "exit";
  return d;
}

policy::Plan evict_plan() {
  policy::Plan p;
  p.rung = policy::PlanRung::kEvict;
  p.action = "evict slot 1, promote standby 4";
  p.why = "a clear culprit on a live slot";
  p.restore.step = 8;
  p.restore.job_source = membership::memory;
  p.promote = {{1, 4}};
  return p;
}

TEST(Incident, WhoIsTheFailuresWhatWasDoneIsThePlans) {
  const Detected d = found_crash();
  Transition t;
  t.epoch = 2;
  t.ladder_rung = 1;
  t.step_in_flight = 10;
  t.steps_completed = 10;
  t.evicted_at = 101;
  t.rebuilt_at = 102;
  const report::Incident inc = incident_of(d, evict_plan(), t);
  EXPECT_EQ(inc.kind(), "crash");
  EXPECT_EQ(inc.detail(), "rank 3 died of signal 9");
  EXPECT_EQ(inc.detected_at(), 100);
  EXPECT_EQ(inc.rank(), 3);
  EXPECT_EQ(inc.slot(), 1);
  EXPECT_EQ(inc.rule(), "exit");
  EXPECT_EQ(inc.ladder_rung(), 1);
  EXPECT_EQ(inc.epoch(), 2);
  EXPECT_EQ(inc.restored_step(), 8);
  EXPECT_EQ(inc.restored_from(), "memory");
  EXPECT_EQ(inc.rung(), "evict");
  EXPECT_EQ(inc.action(), "evict slot 1, promote standby 4");
  EXPECT_EQ(inc.why(), "a clear culprit on a live slot");  // the ladder said nothing
  EXPECT_EQ(inc.step(), 10);
  EXPECT_EQ(inc.steps_lost(), 2);
  ASSERT_EQ(inc.slots_evicted_size(), 1);
  EXPECT_EQ(inc.slots_evicted(0), 1);
  EXPECT_EQ(inc.standbys_promoted(0), 4);
  EXPECT_EQ(inc.evicted_at(), 101);
  EXPECT_EQ(inc.rebuilt_at(), 102);
}

TEST(Incident, ARungsMechanismAndThePlanGiveBothReasons) {
  Detected d;
  d.found.set_kind("comm_error");
  d.failure.rule = "comm_error";
  d.failure.ladder_why = "no culprit: stop-time diagnostics on the suspect slots";
  policy::Plan p;
  p.rung = policy::PlanRung::kReattempt;
  p.why = "no culprit, and the stop-time diagnostics passed";
  Transition t;
  EXPECT_EQ(incident_of(d, p, t).why(),
            "no culprit: stop-time diagnostics on the suspect slots -> no culprit, and the "
            "stop-time diagnostics passed");
  // restart_all runs no mechanism: its plan's reason stands alone.
  p.restart_all = true;
  EXPECT_EQ(incident_of(d, p, t).why(), p.why);
  // Nor is a reason said twice.
  p.restart_all = false;
  p.why = d.failure.ladder_why;
  EXPECT_EQ(incident_of(d, p, t).why(), p.why);
}

TEST(Incident, AReplayNamesAMachineNotARank) {
  Detected d;
  d.found.set_kind("sdc");
  d.found.set_slot(2);
  d.found.set_found_by("replay");
  d.failure.kind = policy::FailureKind::kSdc;
  d.failure.culprit = 5;  // a handle on slot 2
  d.failure.culprit_is_machine = true;
  d.failure.rule = "sdc_replay";
  policy::Plan p = evict_plan();
  p.restore.step = 20;
  p.restore.job_source = membership::persistent;
  p.restore.why = "slot 2's ranks had no backup";
  Transition t;
  t.steps_completed = 15;  // the restore is ahead of every survivor: nothing lost
  const report::Incident inc = incident_of(d, p, t);
  EXPECT_EQ(inc.rank(), -1);
  EXPECT_EQ(inc.slot(), 2);
  EXPECT_EQ(inc.rule(), "sdc_replay");
  EXPECT_EQ(inc.restored_from(), "persistent");
  EXPECT_EQ(inc.why_not_memory(), "slot 2's ranks had no backup");
  EXPECT_EQ(inc.steps_lost(), 0);
  EXPECT_EQ(inc.evicted_at(), 0);
}

}  // namespace
}  // namespace keel
