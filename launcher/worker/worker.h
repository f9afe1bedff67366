// One rank of a job: setup (config, backend, plugin, data, TrainState, communicators), the
// step loop with its hooks, and the report. Snapshots, backups, persistent checkpoints,
// fault injection and the recovery protocol attach to the loop here; the Trainer sees none
// of them (DESIGN.md, State and seams).
#pragma once

#include "launcher/worker_options.h"

namespace keel {

// Runs rank o.rank to the end of the job. Returns the process exit code; recoverable
// failures under a supervisor are handled inside (the rank rebuilds and goes on).
int run_worker(const WorkerOptions& o);

}  // namespace keel
