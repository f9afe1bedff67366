#include "robust/ladder.h"

#include "runtime/check.h"

namespace keel::policy {

const char* rung_name(Rung r) {
  switch (r) {
    case Rung::kCulprit:
      return "culprit";
    case Rung::kDiagnose:
      return "diagnose";
    case Rung::kRollback:
      return "rollback";
    case Rung::kReplay:
      return "replay";
  }
  return "?";
}

LadderStep climb(const Failure& f, int64_t completed, LadderMemory* m, const Options& o) {
  LadderStep s;
  const bool sdc = f.kind == FailureKind::kSdc;
  if (f.culprit >= 0 || !f.dead.empty() || !f.lost_slots.empty() ||
      (f.kind != FailureKind::kCommError && !sdc)) {
    s.why = "a clear culprit";
    return s;
  }
  if (f.rule == "probation") {
    s.rung = Rung::kRollback;
    s.plugin_rollback = true;
    s.why = "new code on probation broke the training: roll the plugin back";
    return s;
  }
  if (sdc) {
    s.rung = Rung::kReplay;
    s.why = "silent data corruption that no check pinned on a rank: a replay looks for the machine";
    return s;
  }
  // Culprit-less failures in a row, each within the window of the one before.
  const int64_t window = o.recovery.repeat_window_steps();
  int repeats = 0;
  int64_t at = completed;
  for (auto it = m->culpritless.rbegin(); window > 0 && it != m->culpritless.rend(); ++it) {
    if (at - *it > window) break;
    ++repeats;
    at = *it;
  }
  m->culpritless.push_back(completed);
  if (repeats == 0) {
    s.rung = Rung::kDiagnose;
    s.why = "no culprit: stop-time diagnostics on the suspect slots";
    return s;
  }
  const std::string again =
      detail::concat("the same failure ", repeats == 1 ? "again" : "a third time", " within ",
                     window, " steps (recovery.repeat_window_steps)");
  const bool updated = m->update_applied_step >= 0 && completed - m->update_applied_step <= window;
  if (repeats == 1 && (updated || o.persistent_step >= 0)) {
    s.rung = Rung::kRollback;
    s.plugin_rollback = updated;
    s.why = again + (updated ? detail::concat(": roll the plugin back (updated at step ",
                                              m->update_applied_step, ")")
                             : detail::concat(": roll back to the persistent checkpoint of step ",
                                              o.persistent_step));
    return s;
  }
  s.rung = Rung::kReplay;
  s.why = again + (repeats == 1 ? ", and nothing to roll back to" : "") +
          ": a dual-phase replay looks for the machine";
  return s;
}

}  // namespace keel::policy
