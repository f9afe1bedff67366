// Which job keel-ctl talks to when told no --run or --controller: the newest run directory
// under ./runs whose controller answers, not merely the newest one (a job killed with -9
// leaves its directory behind and answers nothing). A job that has ended (keel-launch writes
// the event log's `end` last) is not probed; keel-ctl status reads its report instead.
#pragma once

#include <optional>
#include <string>

#include "parallel/job_key.h"
#include "proto/report.pb.h"

namespace keel {

struct FoundRun {
  std::string dir;              // runs/<job>
  std::string endpoint;         // its controller's (empty when the job has ended)
  std::optional<int> end_code;  // the job has ended, with this exit code
  // The job's key from DIR/secret (parallel/job_key.h), or why it could not be read: without
  // it no controller will listen to this process.
  std::optional<JobKey> key;
  std::string key_error;
};

// `runs_dir`'s newest run whose controller answers a status request (asked with the run's key,
// which becomes this process's key); else, when
// `accept_ended`, the newest run that has ended. Throws keel::InputError saying what was
// found when there is neither.
FoundRun find_run(const std::string& runs_dir, bool accept_ended);

// The run directory `dir` as given by --run: its controller's endpoint and, when it has
// ended, its exit code. Throws keel::InputError when `dir` is no run directory.
FoundRun read_run(const std::string& dir);

// The report of an ended run (DIR/report.json), if it wrote one there.
std::optional<report::RunReport> read_run_report(const std::string& dir);

}  // namespace keel
