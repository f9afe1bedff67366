// The recovery protocol between the controller (in keel-launch, or keel-worker --nproc)
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

#include <chrono>
#include <string>

#include "proto/store_keys.h"

namespace keel::recovery {

// Exit codes of a rank that the supervisor must not answer with a restart: the same input
// or the same numbers would fail again.
constexpr int kExitInputError = 2;
constexpr int kExitNonFinite = 4;
// The job could not write what it must: a persistent checkpoint under
// checkpoint.on_write_error: stop (every rank, after the same step, once rank 0's report is
// written), or an output at its end (--report, --loss-svg, --export-llmc; rank 0). A full
// disk stays full: no restart.
constexpr int kExitWriteFailed = 5;
// keel stopped the job itself: a stop rule (recovery.max_incidents, a repeating failure), a
// failure the policy would not recover from (restart_all with no checkpoint to restart from,
// no standby under on_no_standby = fail). Its report says why (RunReport.stop_reason).
// Stopped by a signal, keel-launch and keel-worker exit 128 + the signal, as a shell does.
constexpr int kExitStopped = 6;

// Unix time in seconds, for timelines across processes.
inline double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace keel::recovery
