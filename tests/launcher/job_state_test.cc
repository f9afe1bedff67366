// The job's record as the controller builds and reads it (launcher/controller/job_state.h):
// the decisions' memory survives the round trip through the record, and the key that decides
// whether the record is written again ignores what changes without a decision (a slot's link).
#include "launcher/controller/job_state.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(JobState, TheDecisionsMemoryRoundTrips) {
  policy::StopMemory stops;
  stops.incidents = 2;
  stops.progress_at_last_incident = 140;
  stops.no_progress_incidents = 1;
  const policy::StopMemory s = stop_memory(stop_counts(stops));
  EXPECT_EQ(s.incidents, 2);
  EXPECT_EQ(s.progress_at_last_incident, 140);
  EXPECT_EQ(s.no_progress_incidents, 1);
  // A count carried over stops the job where the first leader's would have.
  policy::StopMemory carried = s;
  EXPECT_TRUE(policy::count_failure(&carried, /*max_incidents=*/2, 300).stop);

  policy::LadderMemory ladder;
  ladder.culpritless = {10, 25};
  ladder.update_applied_step = 7;
  const policy::LadderMemory l = ladder_memory(ladder_record(ladder));
  EXPECT_EQ(l.culpritless, (std::vector<int64_t>{10, 25}));
  EXPECT_EQ(l.update_applied_step, 7);
}

TEST(JobState, ALinksChangeIsNoNewRecordButARolesIs) {
  state::JobState js;
  js.set_term(5);
  membership::SlotInfo* slot = js.mutable_membership()->add_slots();
  slot->set_slot(1);
  slot->set_state(membership::SlotInfo::active);
  slot->set_role(membership::SlotInfo::role_active);
  (*js.mutable_transition()->mutable_renumber())[3] = 1;
  (*js.mutable_transition()->mutable_renumber())[1] = 0;
  const std::string key = job_state_key(js);
  state::JobState b = js;
  b.set_term(9);  // the writer's stamp
  b.mutable_membership()->mutable_slots(0)->set_state(membership::SlotInfo::lost);
  EXPECT_EQ(job_state_key(b), key);
  b.mutable_membership()->mutable_slots(0)->set_role(membership::SlotInfo::role_standby);
  EXPECT_NE(job_state_key(b), key);
  state::JobState c = js;
  c.mutable_stops()->set_incidents(1);
  EXPECT_NE(job_state_key(c), key);
  c = js;
  c.set_commands_done(1);
  EXPECT_NE(job_state_key(c), key);
}

}  // namespace
}  // namespace keel
