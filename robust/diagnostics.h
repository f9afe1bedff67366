// The verdict of stop-time diagnostics (DESIGN.md, Failure handling, rung 2): when a failure
// names no culprit (every rank saw a communication error, no process died), the controller
// stands a fresh process in for each rank of the suspect slots and for every peer of their
// TP, PP and DP groups (launcher/worker/diagnose_worker.h). Each runs the device GEMM self-check,
// the golden mini-GPT and one collective test per group, and answers with a report::Diagnostic.
// This decides, from those answers alone, which suspect slots fail. Pure code;
// launcher/controller/controller_diagnose.cc runs the processes.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "proto/report.pb.h"

namespace keel::diag {

struct Verdict {
  std::vector<int> failed_slots;                    // suspect slots that failed, ascending
  std::map<int, std::vector<std::string>> reasons;  // why, per failed slot
  std::string summary;                              // the verdict in one line
};

// A suspect slot fails when one of the processes that ran on it
// - did not answer (answered = false), or could not run its checks (error set);
// - failed the GEMM self-check or the golden mini-GPT;
// - broke its own links in a group test (it names itself as `blamed_rank`), or is the job
//   rank that more than half of the failing members of one of its group tests name;
// - sent, in a group test that passed for at least three members, below the members' median
//   rate / `slow_factor` (a slow link). With two members both ends wait on the same
//   exchanges, so a slow link cannot be told from a slow peer: no member is judged slow.
// Rows of slots that are not suspect are checked alongside (their processes are the suspects'
// peers) but never fail; their failures are mentioned in the summary.
// The stop-time measurement is one shot, without the in-flight detector's K-of-N rounds to
// filter noise: its slow factor is the detector's (detect.slow_factor) times this margin.
// Measured on a loaded two-core machine, healthy members of one group differed by up to 2x
// (processes that share a core); a link degraded by less is left to the in-flight detector.
constexpr double kOneShotSlowMargin = 2.0;

Verdict judge(const std::vector<report::Diagnostic>& rows, const std::set<int>& suspect_slots,
              double slow_factor = 1.5);

}  // namespace keel::diag
