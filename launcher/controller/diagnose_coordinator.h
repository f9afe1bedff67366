// Stop-time diagnostics, the controller's part (DESIGN.md, Failure handling, rung 2;
// robust/diagnostics.h judges them): with every training worker parked in the recovery
// wait, one fresh process (launcher/worker/diagnose_worker.h) stands in for each rank of the
// suspect slots and for every peer of their TP, PP and DP groups, on that rank's slot. The
// controller writes their task (store::DiagnoseTask) under keys::diagnose_key(incident,
// epoch) and gives each stand-in that key (KEEL_DIAGNOSE); they check the device, the golden
// mini-GPT and each group's links in parallel and answer report::Diagnostic, and whatever has
// not answered by recovery.diagnostics_timeout_ms fails its slot.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "launcher/controller/context.h"

namespace keel {

class DiagnoseCoordinator {
 public:
  explicit DiagnoseCoordinator(const ControllerContext& ctx) : ctx_(ctx) {}

  // Checks the machines of `suspect_slots` for the job's incident number `incident` in the
  // membership's epoch, within recovery.diagnostics_timeout_ms; fills inc's diagnostics,
  // diagnostics_summary and diagnosed_at, and returns the suspect slots that failed (empty:
  // all passed, or nothing could run: the summary says why).
  std::vector<int> run(const std::set<int>& suspect_slots, int incident, report::Incident* inc);

 private:
  // The stand-ins' answers under `key`, one row per job rank of `ranks`, waiting up to
  // `budget_ms`: one that has not answered by then is a row that says so.
  std::vector<report::Diagnostic> collect(const std::string& key, const std::set<int>& ranks,
                                          int budget_ms);

  const ControllerContext& ctx_;
};

}  // namespace keel
