#include "robust/stop_rules.h"

#include "runtime/check.h"

namespace keel::policy {

StopVerdict count_failure(StopMemory* m, int max_incidents, int64_t progress_now) {
  StopVerdict v;
  if (++m->incidents > max_incidents) {
    v.stop = true;
    v.why = detail::concat(m->incidents,
                           " incidents, more than recovery.max_incidents = ", max_incidents);
    return v;
  }
  m->no_progress_incidents =
      progress_now == m->progress_at_last_incident ? m->no_progress_incidents + 1 : 0;
  m->progress_at_last_incident = progress_now;
  if (m->no_progress_incidents >= 2) {
    v.stop = true;
    v.why = detail::concat("the job completed no step since the last ", m->no_progress_incidents,
                           " recoveries, so this failure repeats");
  }
  return v;
}

}  // namespace keel::policy
