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

#include "launcher/exit_codes.h"
#include "proto/store_keys.h"

namespace keel::recovery {

// Exit codes: launcher/exit_codes.h (recovery::kExitStopped and the others are named there).

// Unix time in seconds, for timelines across processes.
inline double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace keel::recovery
