#include "launcher/controller/incident.h"

#include <algorithm>

namespace keel {

const char* restored_from_name(membership::Source s) {
  return s == membership::persistent ? "persistent"
         : s == membership::scratch  ? "scratch"
                                     : "memory";
}

report::Incident incident_of(const Detected& d, const policy::Plan& plan, const Transition& t) {
  report::Incident inc = d.found;
  // Who and how: the policy's. A replay names a machine, not a rank: the failure's culprit is
  // only a handle on the machine's slot (found.slot), and the record names no rank.
  inc.set_rank(d.failure.culprit_is_machine ? -1 : d.failure.culprit);
  inc.set_rule(d.failure.rule);
  inc.set_ladder_rung(t.ladder_rung);
  // What was done: the plan's.
  inc.set_epoch(t.epoch);
  inc.set_restored_step(int(plan.restore.step));
  inc.set_restored_from(restored_from_name(plan.restore.job_source));
  inc.set_why_not_memory(plan.restore.why);
  inc.set_action(plan.action);
  inc.set_rung(policy::plan_rung_name(plan.rung));
  // A rung's mechanism (2-4) decided what the plan works with: the record says both reasons.
  // restart_all runs no mechanism; its plan's reason stands alone.
  const bool both =
      !plan.restart_all && !d.failure.ladder_why.empty() && plan.why != d.failure.ladder_why;
  inc.set_why(both ? d.failure.ladder_why + " -> " + plan.why : plan.why);
  for (const auto& [slot, standby] : plan.promote) {
    inc.add_slots_evicted(slot);
    inc.add_standbys_promoted(standby);
  }
  // What it cost: the transition's.
  inc.set_step(int(t.step_in_flight));
  inc.set_steps_lost(
      int(std::max<int64_t>(0, t.steps_completed - std::max<int64_t>(plan.restore.step, 0))));
  if (t.evicted_at > 0) inc.set_evicted_at(t.evicted_at);
  inc.set_rebuilt_at(t.rebuilt_at);
  return inc;
}

}  // namespace keel
