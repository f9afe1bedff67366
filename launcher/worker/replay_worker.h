// One process of a stop-time dual-phase SDC replay (DESIGN.md, Failure handling): the
// controller parks the job's workers, splits the machines into groups that each host one
// whole TP×PP pipeline (data parallelism 1), and starts on each group T·P replay workers.
// They load the job's state of step A from the parked workers' backup servers, run exactly
// step A, and publish a digest of the resulting state; a group whose digest differs from
// the majority ran on a defective machine.
//
// Started by the agent like a training worker (the same argv) with, in the environment,
//   KEEL_REPLAY=<key>:<step A>:<job epoch>:<job data parallelism D>
//   KEEL_RANK (0 .. T·P-1, within the group), KEEL_WORLD_SIZE = T·P, KEEL_STORE_ADDR,
//   KEEL_SLOT (the machine; its recorded defect, robust/fault_injector.h, is armed),
//   KEEL_LOCAL_WORLD_SIZE.
// What it leaves in the job's store (`key` has no ':'):
//   <key>/digest  group rank 0: 16 hex digits, the block digest of every rank's state
//                 digests (params, adam_m, adam_v) after the step, in rank order
//   <key>/loss    group rank 0: the step's loss ("%.17g")
//   <key>/error   "<rank>: <what>", from the first rank that failed (claimed with
//                 add(<key>/errors, 1) == 1, so a peer's later timeout does not hide it)
// The group's communicators meet under the store prefix "<key>/pg/", so no two groups (nor
// the job) ever share a rendezvous key.
#pragma once

#include "launcher/worker_options.h"

namespace keel {

// Runs this replay worker (KEEL_REPLAY must be set). Returns the exit code: 0 with the digest
// published (rank 0) or the step done, 1 after publishing an error.
int run_replay_worker(const WorkerOptions& o);

}  // namespace keel
