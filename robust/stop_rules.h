// When the job stops instead of recovering (DESIGN.md, Failure handling): pure code, asked
// by the controller once for every failure before it starts the epoch transition.
//   - more incidents than recovery.max_incidents;
//   - a failure that comes back before the job completed a single step since the last two
//     (every rank failing to connect, say) will not go away by restarting.
#pragma once

#include <cstdint>
#include <string>

namespace keel::policy {

// What the rules remember between failures.
struct StopMemory {
  int incidents = 0;                       // failures so far, this one included
  int64_t progress_at_last_incident = -2;  // steps completed at the last one (-1: unknown)
  int no_progress_incidents = 0;           // consecutive ones at the same progress, minus one
};

struct StopVerdict {
  bool stop = false;
  std::string why;  // stop: why, one line to follow the failure's detail
};

// Counts a failure seen with `progress_now` steps completed (-1: not known) and says whether
// the job must stop. A failure past max_incidents is counted but leaves the progress memory
// as it was.
StopVerdict count_failure(StopMemory* m, int max_incidents, int64_t progress_now);

}  // namespace keel::policy
