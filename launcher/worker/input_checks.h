// Checks made before the first step, so that a bad input costs seconds, not a run: output
// paths that cannot be written, data that does not fit the model, a job too large for the
// machine. Each failure is a keel::InputError naming the file, field and value.
#pragma once

#include "launcher/worker_options.h"
#include "proto/config.pb.h"

namespace keel {

// Checks made by the --nproc parent before it starts any rank, so that each failure is
// reported once: --nproc <= 4096; the config loads (a directory or missing file is named);
// --nproc equals parallel.tp·pp·dp; the output files and checkpoint.dir can be written
// (below); a --resume has a usable checkpoint of this model, not past train.steps
// (check_resume, ckpt/persistent_checkpoint.h); and the N ranks fit in this machine's memory
// (model/memory_estimate.h).
void check_launch(const WorkerOptions& o);

// Checks made by each rank right after it read its config, before it allocates or trains:
// on rank 0, --report, --loss-svg and --export-llmc must name a file (not a directory) in an
// existing directory that takes a new file; checkpoint.dir (when
// checkpoint.persistent_every_steps > 0) must be, or be creatable under, such a directory;
// and the ranks on this machine (KEEL_LOCAL_WORLD_SIZE consecutive ranks) must fit in its
// host memory. The data (every token, shard sizes) is checked by DataLoader::from_config.
void check_job_inputs(const WorkerOptions& o, const config::JobConfig& cfg);

}  // namespace keel
