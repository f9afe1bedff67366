// What a job did, as its store remembers it: the store outlives every rank, so rank 0 can
// report steps run by an earlier rank 0 (before a crash or a restart_all), the incidents the
// controller recorded, the injections and the processes that served each rank.
#pragma once

#include "parallel/store.h"
#include "proto/config.pb.h"
#include "proto/report.pb.h"

namespace keel {

struct JobHistory {
  double kept_s = 0;        // wall time in the steps whose results were kept
  double timed_s = 0;       // the same without the job's first step (warm-up)
  double timed_tokens = 0;  // tokens of those timed steps
};

// Adds to `rep` the steps' losses, norms, learning rates, time split, bytes and validation
// losses (from train's start step), the ranks' PIDs and the incidents with their timeline
// completed (injection, restore and first-step times).
JobHistory read_job_history(Store& store, const config::JobConfig& cfg, int world, bool has_val,
                            report::RunReport* rep);

}  // namespace keel
