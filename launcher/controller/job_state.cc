#include "launcher/controller/job_state.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

namespace keel {

state::StopCounts stop_counts(const policy::StopMemory& m) {
  state::StopCounts c;
  c.set_incidents(m.incidents);
  c.set_progress_at_last_incident(m.progress_at_last_incident);
  c.set_no_progress_incidents(m.no_progress_incidents);
  return c;
}

policy::StopMemory stop_memory(const state::StopCounts& c) {
  policy::StopMemory m;
  m.incidents = c.incidents();
  m.progress_at_last_incident = c.progress_at_last_incident();
  m.no_progress_incidents = c.no_progress_incidents();
  return m;
}

state::LadderMemory ladder_record(const policy::LadderMemory& m) {
  state::LadderMemory r;
  for (int64_t s : m.culpritless) r.add_culpritless(s);
  r.set_update_applied_step(m.update_applied_step);
  return r;
}

policy::LadderMemory ladder_memory(const state::LadderMemory& r) {
  policy::LadderMemory m;
  m.culpritless.assign(r.culpritless().begin(), r.culpritless().end());
  m.update_applied_step = r.update_applied_step();
  return m;
}

std::string job_state_key(const state::JobState& js) {
  // Only what changes between transitions, copied: the rank -> slot map and the Rebuild (the
  // size of the job) change with a transition, which writes the record itself.
  state::JobState k;
  for (const auto& s : js.membership().slots()) {
    membership::SlotInfo* slot = k.mutable_membership()->add_slots();
    *slot = s;
    slot->clear_state();  // the link; the role is kept
    slot->clear_host();
  }
  *k.mutable_stops() = js.stops();
  *k.mutable_ladder() = js.ladder();
  *k.mutable_update() = js.update();
  k.set_commands(js.commands());
  k.set_commands_done(js.commands_done());
  std::string out;
  {
    google::protobuf::io::StringOutputStream raw(&out);
    google::protobuf::io::CodedOutputStream coded(&raw);
    coded.SetSerializationDeterministic(true);
    k.SerializeToCodedStream(&coded);
  }
  return out;
}

}  // namespace keel
