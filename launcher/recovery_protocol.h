// The recovery protocol between the supervisor (keel-worker --nproc; later the controller)
// and the ranks, as keys of the job's rendezvous store. The store lives in the supervisor,
// so it outlives every rank and a restarted rank finds the job where it left it.
//
// Epoch E+1 is entered like this (DESIGN.md, Recovery protocol):
//   1. a rank hits a CommError in epoch E and adds 1 to errors/E; or a rank dies and the
//      supervisor sees its exit status;
//   2. the supervisor sets abort/E+1; every rank's watcher thread aborts its communicators,
//      so any pending collective returns at once; each surviving rank settles its snapshot
//      copy and sets ack/E+1/<rank> = keel.membership.Ack (steps completed, step in flight);
//   3. the controller decides (robust/recovery_policy.h): restarts dead ranks (and kills any
//      rank that did not ack in time: it is hung), picks the restore step S and its source,
//      and sets rebuild/E+1 = keel.membership.Rebuild (membership, S, source; S = -1: the
//      job's start state);
//   4. every rank builds communicators under prefix "E+1/", restores S where its own state
//      is not already S (from memory, its snapshot, its backup holder, or the persistent
//      checkpoint when the Rebuild says so), sets restored/E+1/<rank> and goes on.
#pragma once

#include <string>

namespace keel::recovery {

inline std::string abort_key(int epoch) {
  return "abort/" + std::to_string(epoch);
}
inline std::string errors_key(int epoch) {
  return "errors/" + std::to_string(epoch);
}
inline std::string error_key(int epoch, int rank) {
  return "error/" + std::to_string(epoch) + "/" + std::to_string(rank);
}
inline std::string ack_key(int epoch, int rank) {
  return "ack/" + std::to_string(epoch) + "/" + std::to_string(rank);
}
inline std::string rebuild_key(int epoch) {
  return "rebuild/" + std::to_string(epoch);
}
inline std::string restored_key(int epoch, int rank) {
  return "restored/" + std::to_string(epoch) + "/" + std::to_string(rank);
}
// Where rank r's state came from in epoch E: "memory", "own_snapshot", "backup",
// "persistent", "scratch" (the incident's rank_sources).
inline std::string restored_from_key(int epoch, int rank) {
  return "restored_from/" + std::to_string(epoch) + "/" + std::to_string(rank);
}
// Set by rank 0 when the first step of an epoch completes (for incident timelines).
inline std::string first_step_key(int epoch) {
  return "first_step/" + std::to_string(epoch);
}
// Where rank r's backup server listens in epoch E.
inline std::string backup_addr_key(int epoch, int rank) {
  return "backup_addr/" + std::to_string(epoch) + "/" + std::to_string(rank);
}
// Incidents (report::Incident, serialised): incident/count and incident/<n>.
inline std::string incident_key(int64_t n) {
  return "incident/" + std::to_string(n);
}
inline const char* kIncidentCount = "incident/count";
// Rank 0's metrics of each step (report::StepRecord), overwritten when a step is run again.
inline std::string step_key(int64_t step) {
  return "step/" + std::to_string(step);
}
// A rank's fail-slow figures at the job's end (report::RankPerf), for rank 0's report.
inline std::string rank_perf_key(int rank) {
  return "perf/rank/" + std::to_string(rank);
}
inline std::string eval_key(int64_t step) {
  return "eval/" + std::to_string(step);
}
// Silent data corruption (robust/sdc_check.h): the verdict of a check that failed in epoch E
// (report::Incident, serialised, written by every rank alike before it reports the failure),
// the newest step the checks verified (rank 0, after every passing check), the count of
// checks run, and the injected sdc faults that no check could see ("sdc/missed/<n>").
inline std::string sdc_verdict_key(int epoch) {
  return "sdc/verdict/" + std::to_string(epoch);
}
inline const char* kSdcVerified = "sdc/verified";
// Hot updates (launcher/controller_update.cc, launcher/worker_update.cc): the plan of update n
// (report::Update), each rank's check of it ("ok" or "refused: why"), the controller's
// decision ("step S": apply before step S; "refused: why"), each rank's report that it applied
// it, and the plugin every new process of the job must run ("<hash> <path>").
inline std::string update_key(int64_t n) {
  return "update/" + std::to_string(n);
}
inline std::string update_check_key(int64_t n, int rank) {
  return update_key(n) + "/check/" + std::to_string(rank);
}
inline std::string update_apply_key(int64_t n) {
  return update_key(n) + "/apply";
}
inline std::string update_applied_key(int64_t n, int rank) {
  return update_key(n) + "/applied/" + std::to_string(rank);
}
inline std::string update_record_key(int64_t n) {
  return "updates/" + std::to_string(n);
}
inline const char* kUpdateCount = "updates/count";
// Why the ranks failed in epoch E when new code on probation broke the training (a non-finite
// loss, a loss jump): set by every rank before it reports the failure.
inline std::string update_failure_key(int epoch) {
  return "update/failure/" + std::to_string(epoch);
}
inline const char* kPluginCurrent = "plugin/current";
inline const char* kSdcChecks = "sdc/checks";
inline const char* kSdcCheckSeconds = "sdc/check_seconds";

// Exit codes of a rank that the supervisor must not answer with a restart: the same input
// or the same numbers would fail again.
constexpr int kExitInputError = 2;
constexpr int kExitNonFinite = 4;
// The job could not write what it must: a persistent checkpoint under
// checkpoint.on_write_error: stop (every rank, after the same step, once rank 0's report is
// written), or an output at its end (--report, --loss-svg, --export-llmc; rank 0). A full
// disk stays full: no restart.
constexpr int kExitWriteFailed = 5;

// Unix time in seconds, for timelines across processes.
double unix_now();

}  // namespace keel::recovery
