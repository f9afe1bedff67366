// What a job did, as its store remembers it: the store outlives every rank, so rank 0 can
// report steps run by an earlier rank 0 (before a crash or a restart_all), the incidents the
// controller recorded, the injections and the processes that served each rank; and the
// controller can report a job it stops itself, whose rank 0 never reaches its end. The writers
// are job_record.h (rank 0's steps and figures), step_witness.h (their copies), the ranks
// (restored/<E>/<rank>, restored_from/<E>/<rank>) and the controller (incidents).
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "parallel/store.h"
#include "proto/config.pb.h"
#include "proto/report.pb.h"
#include "proto/store_keys.h"

namespace keel {

// How long the report waits for a value that must be there (the start step, a record of the
// first step, a PID, an incident): the writer set it before it went on, so only a loaded
// store is slow.
inline constexpr std::chrono::milliseconds kRecordWait{10000};
// A per-step value keel did not measure (a step without record): NaN in the report's
// arrays, null in its JSON (run_report.h), a break in every curve.
inline constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();
// How long it waits for a later step's record or an evaluation, which a failure may have
// lost for good (the point is then missing, not the report).
inline constexpr std::chrono::milliseconds kStepRecordWait{200};
inline constexpr std::chrono::milliseconds kEvalWait{100};

struct JobHistory {
  double kept_s = 0;        // wall time in the steps whose results were kept
  double timed_s = 0;       // the same without the job's first step (warm-up)
  double timed_tokens = 0;  // tokens of those timed steps
};

// Adds to `rep` the steps' losses, norms, learning rates, time split, bytes and validation
// losses (from train's start step), each step's end in seconds since `job_start` (unix
// seconds), the final loss (the last one measured), the ranks' PIDs and the incidents with
// their timeline completed (injection, restore and first-step times).
JobHistory read_job_history(Store& store, const config::JobConfig& cfg, int world, bool has_val,
                            double job_start, report::RunReport* rep);

}  // namespace keel
