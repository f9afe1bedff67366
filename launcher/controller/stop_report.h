// The report of a job keel stops itself (Controller::Impl::stop_job): rank 0 never reaches
// the job's end, so the controller writes report.json from what the job's store remembers
// (launcher/job_history.h): the steps done, their losses and times, the incidents and the
// ranks' processes, with `stopped` and the reason. Hundreds of steps of results must not
// survive only in events.jsonl.
#pragma once

#include <string>

#include "parallel/store.h"
#include "proto/config.pb.h"

namespace keel {

// Writes `path` (whole or not at all) unless rank 0 has written this job's report already
// (a checkpoint stop ends with rank 0's own). `job_start` is the job's unix start time.
// Throws keel::Error naming the file when it cannot be written. With the store out of reach
// (QuorumLost: an etcd that lost its quorum for good) it writes what the controller knows:
// why, the layout and `steps_seen`, no step records.
// `steps_seen`: the steps every rank reported done over the control plane (the store's
// progress comes in rank 0's batches, a second apart): the report says the larger.
void write_stop_report(Store& store, const config::JobConfig& cfg, double job_start,
                       const std::string& why, const std::string& path, int64_t steps_seen = 0);

}  // namespace keel
