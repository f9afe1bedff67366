// Every key of the job's store, and of its control state in etcd (at the end), in one place
// (DESIGN.md, Control state). The value under each
// is a protobuf message, named beside it (proto/store_values.proto unless said otherwise),
// or an integer counter kept with Store::add. Keys of one epoch E carry E, so that the
// next epoch never meets an old value; the communicators' rendezvous lives under the prefix
// epoch_prefix(E) and names its own keys below it (parallel/).
//
// Writers and readers, per group:
//   recovery     the controller (abort, rebuild) and the ranks (errors, acks, restored)
//   job record   rank 0 (steps, evals, live figures) for the report and keel-ctl status
//   standby      the controller's AgentHost and the parked standby workers
//   updates      the controller's update manager and the ranks' update watchers
//   faults       the fault injector of every rank, keel-ctl inject
//   checkpoints  every rank's persistent checkpointer and rank 0's sealer
//   stand-ins    the controller's diagnostics and replay, and their workers
#pragma once

#include <cstdint>
#include <string>

namespace keel::keys {

namespace detail {
inline std::string join(const std::string& a, int64_t b) {
  return a + std::to_string(b);
}
inline std::string join(const std::string& a, int64_t b, int64_t c) {
  return a + std::to_string(b) + "/" + std::to_string(c);
}
}  // namespace detail

// --- recovery (launcher/recovery_protocol.h tells the protocol) ---
// Prefix of epoch E's communicator rendezvous ("E/").
inline std::string epoch_prefix(int epoch) {
  return std::to_string(epoch) + "/";
}
inline std::string abort_key(int epoch) {  // store::Abort
  return detail::join("abort/", epoch);
}
inline std::string errors_key(int epoch) {  // counter: communication errors in epoch E
  return detail::join("errors/", epoch);
}
inline std::string error_key(int epoch, int rank) {  // store::RankError
  return detail::join("error/", epoch, rank);
}
inline std::string ack_key(int epoch, int rank) {  // membership::Ack
  return detail::join("ack/", epoch, rank);
}
inline std::string rebuild_key(int epoch) {  // membership::Rebuild
  return detail::join("rebuild/", epoch);
}
inline std::string restored_key(int epoch, int rank) {  // store::Time: when it restored
  return detail::join("restored/", epoch, rank);
}
// Where rank r's state came from in epoch E (the incident's rank_sources): store::Restored.
inline std::string restored_from_key(int epoch, int rank) {
  return detail::join("restored_from/", epoch, rank);
}
// Set by rank 0 when the first step of an epoch completes: store::Time.
inline std::string first_step_key(int epoch) {
  return detail::join("first_step/", epoch);
}
// Where rank r's backup server listens in epoch E: store::Endpoint.
inline std::string backup_addr_key(int epoch, int rank) {
  return detail::join("backup_addr/", epoch, rank);
}
// Set by rank r of epoch E's layout once it has read its state from the old layout's copies
// (a reshape): store::Step, its step, or -1 when it could not. The old servers close after
// every rank's.
inline std::string reshard_read_key(int epoch, int rank) {
  return epoch_prefix(epoch) + "reshard_read/" + std::to_string(rank);
}
// The prefixes of epoch E's keys that nothing reads once every rank has left it.
inline std::string ack_prefix(int epoch) {
  return detail::join("ack/", epoch) + "/";
}
inline std::string error_prefix(int epoch) {
  return detail::join("error/", epoch) + "/";
}
inline std::string backup_addr_prefix(int epoch) {
  return detail::join("backup_addr/", epoch) + "/";
}

// --- job record ---
// Incidents (report::Incident): incident/count (counter) and incident/<n>.
inline constexpr const char* kIncidentPrefix = "incident/";
inline std::string incident_key(int64_t n) {
  return detail::join(kIncidentPrefix, n);
}
inline constexpr const char* kIncidentCount = "incident/count";
// Rank 0's metrics of each step (report::StepRecord), overwritten when a step is run again.
inline std::string step_key(int64_t step) {
  return detail::join("step/", step);
}
// The same record as kept by the record's witness (launcher/worker/step_witness.h), written
// when a failure finds it missing from step/<S>: the report reads the newer epoch's of the two.
inline constexpr const char* kStepCopyPrefix = "step_copy/";
inline std::string step_copy_key(int64_t step) {
  return detail::join(kStepCopyPrefix, step);
}
// A rank's fail-slow figures at the job's end (report::RankPerf), for rank 0's report.
inline std::string rank_perf_key(int rank) {
  return detail::join("perf/rank/", rank);
}
inline std::string eval_key(int64_t step) {  // store::Eval
  return detail::join("eval/", step);
}
// The processes that served rank r: a counter (pids/<r>/count) and one report::RankProcesses
// with the rank and one PID under each pids/<r>/<i>.
inline std::string pid_count_key(int rank) {
  return detail::join("pids/", rank) + "/count";
}
inline std::string pid_key(int rank, int64_t i) {
  return detail::join("pids/", rank, i);
}
// Steps completed by rank 0 (store::Step): the controller's "did the job progress" check.
inline constexpr const char* kProgress = "progress";
// The step the job's report starts at (store::Step), claimed once by counter.
inline constexpr const char* kStartStep = "start_step";
inline constexpr const char* kStartStepClaimed = "start_step/claimed";
// Rank 0's figures so far for keel-ctl status (store::Live).
inline constexpr const char* kLive = "live";
// Counter: reports rank 0 has written (at the job's end, or a checkpoint stop's). A
// controller that stops the job writes one only when rank 0 has not.
inline constexpr const char* kReportsWritten = "report/written";

// --- silent data corruption (robust/sdc_check.h) ---
// The verdict of a check that failed in epoch E (report::Incident, written by every rank
// alike before it reports the failure); the newest step the checks verified (store::Step,
// rank 0); the count of checks run (counter) and their time (store::Seconds).
inline std::string sdc_verdict_key(int epoch) {
  return detail::join("sdc/verdict/", epoch);
}
inline constexpr const char* kSdcVerified = "sdc/verified";
inline constexpr const char* kSdcChecks = "sdc/checks";
inline constexpr const char* kSdcCheckSeconds = "sdc/check_seconds";

// --- hot updates (launcher/controller/ and launcher/worker/ update code) ---
inline std::string update_key(int64_t n) {  // report::Update: the plan of update n
  return detail::join("update/", n);
}
inline std::string update_check_key(int64_t n, int rank) {  // store::UpdateCheck
  return update_key(n) + detail::join("/check/", rank);
}
inline std::string update_apply_key(int64_t n) {  // store::UpdateDecision
  return update_key(n) + "/apply";
}
inline std::string update_applied_key(int64_t n, int rank) {  // store::Step
  return update_key(n) + detail::join("/applied/", rank);
}
inline std::string update_record_key(int64_t n) {  // report::Update, as it ended
  return detail::join("updates/", n);
}
inline constexpr const char* kUpdateCount = "updates/count";
// Why new code on probation broke the training in epoch E (store::UpdateFailure).
inline std::string update_failure_key(int epoch) {
  return detail::join("update/failure/", epoch);
}
// The plugin every new process of the job runs (store::Plugin).
inline constexpr const char* kPluginCurrent = "plugin/current";

// --- standby slots (launcher/worker/standby.h) ---
// <gen> counts the times a slot was made a standby, so a slot that comes back never reads the
// keys of its earlier life.
inline std::string standby_ready_key(int slot, int index, int gen) {  // store::StandbyCheck
  return detail::join("standby/ready/", slot, index) + "/" + std::to_string(gen);
}
inline std::string standby_assign_key(int slot, int index, int gen) {  // store::StandbyAssign
  return detail::join("standby/assign/", slot, index) + "/" + std::to_string(gen);
}
// The prefix of the standbys' collective self-check rendezvous.
inline constexpr const char* kStandbyCheckGroup = "standby/check";

// --- faults (robust/fault_injector.h) ---
// A scheduled fault's claim (counter): the first rank to add 1 fires it.
inline std::string fault_fired_key(int index) {
  return "fault/" + std::to_string(index) + "/fired";
}
// Injected faults that fired: inject/count (counter), inject/<n> (store::Injection).
inline constexpr const char* kInjectCount = "inject/count";
inline constexpr const char* kInjectionPrefix = "inject/";
inline std::string injection_key(int64_t n) {
  return detail::join(kInjectionPrefix, n);
}
// Faults keel-ctl inject sent to a running job: a count and a faults::Fault each, checked
// by the controller when it accepted them.
inline constexpr const char* kRuntimeFaultCount = "runtime_faults/count";
inline std::string runtime_fault_key(int64_t n) {
  return detail::join("runtime_faults/", n);
}
// A machine's injected defect (faults::Fault), and a counter beside it that says it
// exists: a lookup asks the counter, a plain round trip.
inline std::string machine_defect_key(int slot) {
  return detail::join("sdc/defective/", slot);
}
inline std::string machine_link_defect_key(int slot) {
  return detail::join("link/defective/", slot);
}
inline std::string exists_key(const std::string& key) {
  return key + "/set";
}

// --- persistent checkpoints (ckpt/persistent_checkpoint.h) ---
inline std::string checkpoint_part_key(int64_t step, int rank) {  // store::CheckpointPart
  return detail::join("ckpt/", step, rank);
}

// --- stand-ins: stop-time diagnostics and SDC replay ---
// Diagnostics of incident n in epoch E: the task (store::DiagnoseTask), each stand-in's
// answer (report::Diagnostic), and the prefix of their collective tests.
inline std::string diagnose_key(int incident, int epoch) {
  return detail::join("diag/", incident, epoch);
}
inline std::string diagnose_task_key(const std::string& diagnose) {
  return diagnose + "/task";
}
inline std::string diagnose_result_key(const std::string& diagnose, int rank) {
  return diagnose + detail::join("/result/", rank);
}
// Replay of incident n, phase p, group g: the task (store::ReplayTask), the group's answer
// (store::ReplayResult), a count of its errors, and its communicators' prefix.
inline std::string replay_key(int incident, int phase, int group) {
  return detail::join("replay/", incident, phase) + "/" + std::to_string(group);
}
inline std::string replay_task_key(const std::string& replay) {
  return replay + "/task";
}
inline std::string replay_result_key(const std::string& replay) {
  return replay + "/result";
}
inline std::string replay_errors_key(const std::string& replay) {
  return replay + "/errors";
}
inline std::string replay_groups_prefix(const std::string& replay) {
  return replay + "/pg/";
}

// --- the job's control state, in etcd (proto/control_state.proto) ---
// Every key under /keel/<job>/, written only by the leader controller, each write fenced on
// its leadership (launcher/controller/etcd_control_state.h); never on the step path.
namespace state {
inline std::string root(const std::string& job) {
  return "/keel/" + job + "/";
}
// The election's candidacy keys (state::Leader values; launcher/etcd/leader_election.h).
inline std::string leader_prefix(const std::string& job) {
  return root(job) + "leader/";
}
inline std::string spec(const std::string& job) {  // state::JobSpec
  return root(job) + "spec";
}
// The job's rendezvous store (launcher/etcd/etcd_store.h): every key of the sections above,
// under this prefix.
inline std::string store_prefix(const std::string& job) {
  return root(job) + "store/";
}
inline std::string end(const std::string& job) {  // state::JobEnd, once the job ended
  return root(job) + "end";
}
// state::JobState: the one record of the job (membership and epoch, the newest transition's
// Rebuild, the decisions' memory, the update, the command log's progress).
inline std::string job_state(const std::string& job) {
  return root(job) + "job";
}
inline std::string etcd_members(const std::string& job) {  // state::EtcdMembers
  return root(job) + "etcd_members";
}
inline std::string plugin(const std::string& job) {  // store::Plugin in force
  return root(job) + "plugin";
}
inline std::string incident(const std::string& job, int64_t n) {  // report::Incident n
  return root(job) + "incident/" + std::to_string(n);
}
inline std::string update(const std::string& job, int64_t n) {  // report::Update n, as it stands
  return root(job) + "update/" + std::to_string(n);
}
// The numbered command log: keel-ctl's requests as the controller took them
// (control::Envelope), each under the next number, created once.
inline std::string command(const std::string& job, int64_t n) {
  return root(job) + "command/" + std::to_string(n);
}
}  // namespace state

}  // namespace keel::keys
