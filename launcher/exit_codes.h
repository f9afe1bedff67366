// Every exit status a keel process gives on purpose, in one place: keel-launch, keel-worker,
// a slot's agent, a controller candidate. A supervisor (the agent, keel-launch, a scheduler's
// requeue rule, a script) acts on these; any other status is a crash or a signal (128 + the
// signal, as a shell says it). Read by every keel process.
#pragma once

namespace keel {

// Bad input (a config, a flag, a file): the same input would fail again, so no restart.
// Also a joining slot the controller refused (wrong job id, slot out of range or in use).
inline constexpr int kExitInputError = 2;
inline constexpr int kExitJoinRefused = kExitInputError;
// A rank's loss or gradients went non-finite and no recovery applies: the same numbers would
// fail again.
inline constexpr int kExitNonFinite = 4;
// The job could not write what it must: a persistent checkpoint under
// checkpoint.on_write_error: stop (every rank, after the same step, once rank 0's report is
// written), or an output at its end (--report, --loss-svg, --export-llmc; rank 0). A full
// disk stays full: no restart.
inline constexpr int kExitWriteFailed = 5;
// keel stopped the job itself: a stop rule (recovery.max_incidents, a repeating failure), a
// failure the policy would not recover from, etcd without quorum past
// detect.quorum_timeout_ms. Its report says why (RunReport.stop_reason).
inline constexpr int kExitStopped = 6;
// A slot's agent (and its joined keel-launch) whose controller went silent for
// detect.controller_timeout_ms: the slot stopped its workers and removed its shared memory.
// sysexits.h's EX_TEMPFAIL: nothing is wrong with the slot; the job can be resumed.
inline constexpr int kExitControllerLost = 75;
// A controller that another replaced (its lease lapsed, etcd refused its fenced write): it
// stopped acting; keel-launch then waits for the job's end from the leader that took over.
inline constexpr int kExitDeposed = 76;
// A slot's agent whose registration a new leader refused: the slot was taken as lost while it
// could not be heard and its ranks went elsewhere (not the job's exit status).
inline constexpr int kExitSlotGone = 77;

// The names the ranks' recovery code has always used (launcher/recovery_protocol.h).
namespace recovery {
using keel::kExitInputError;
using keel::kExitNonFinite;
using keel::kExitStopped;
using keel::kExitWriteFailed;
}  // namespace recovery

}  // namespace keel
