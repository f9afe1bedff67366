// keel-bench's report: one BenchRun (proto/bench.proto) per keel-launch run, with the time the
// run did not spend in kept steps split by cause, and the whole report as JSON.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "proto/bench.pb.h"
#include "proto/report.pb.h"

namespace keel::bench {

// The lost time of `r`'s incidents by phase (detection, eviction, rebuild, restore, first
// step), its thrown-away steps at `step_s` each, and the rest of wall − productive as other.
// A phase whose ends were not both recorded counts nothing.
LostTime lost_time(const report::RunReport& r, double step_s);

// The BenchRun of one finished run: `r` is keel-launch's report (empty when it failed),
// `tokens_per_step` the config's global batch × sequence length, `reference_checksum` the
// fault-free run's parameters (empty for the fault-free run itself).
BenchRun make_run(const std::string& name, const std::string& policy, int exit_code,
                  const report::RunReport& r, double step_s, double tokens_per_step,
                  const std::string& reference_checksum);

// One scalar as written to the event files: tag, step, unix wall time, value.
using ScalarSink = std::function<void(const std::string&, int64_t, double, double)>;

// Writes `r`'s curves as TensorBoard event files in `dir` (bench/tfevents.h): per kept step,
// loss, MFU, tokens/s and the cumulative ETTR (the kept steps' share, at the mean kept step,
// of the time since the job's start; `step_s` stands in for a run that kept none). `also`,
// if given, sees every scalar written.
void write_run_events(const std::string& dir, const BenchRun& r, double step_s,
                      const ScalarSink& also = nullptr);

// Writes `text` to `path`, replacing it; throws std::runtime_error naming the path when the
// file cannot be written whole (a full disk, a missing directory).
void write_file(const std::string& path, const std::string& text);

// The report through protobuf's JSON printer (field names as in the .proto, indented).
std::string report_json(const BenchReport& rep);

}  // namespace keel::bench
