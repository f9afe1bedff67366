// Checks made before the first step, so that a bad input costs seconds, not a run: output
// paths that cannot be written, data that does not fit the model, a job too large for the
// machine. Each failure is a keel::InputError naming the file, field and value.
#pragma once

#include "launcher/worker_options.h"
#include "proto/config.pb.h"

namespace keel {

// Checks made by the parent before it starts any rank (--nproc bounds, --config is a file).
void check_launch(const WorkerOptions& o);

// Checks made by each rank after it read its config, before it allocates or trains.
void check_job_inputs(const WorkerOptions& o, const config::JobConfig& cfg);

}  // namespace keel
