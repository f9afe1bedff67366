// One process of a stop-time dual-phase SDC replay (DESIGN.md, Failure handling): the
// controller parks the job's workers, splits the machines into groups that each host one
// whole TP×PP pipeline (data parallelism 1), and starts on each group T·P replay workers.
// They load the job's state of step A from the parked workers' backup servers, run exactly
// step A, and publish a digest of the resulting state; a group whose digest differs from
// the majority ran on a defective machine.
//
// Started by the agent like a training worker (the same argv) with, in the environment,
//   KEEL_REPLAY=<key>  the group's store key K (keys::replay_key), its task at
//                      keys::replay_task_key(K): store::ReplayTask {step A, epoch, source_dp}
//   KEEL_RANK (0 .. T·P-1, within the group), KEEL_WORLD_SIZE = T·P, KEEL_STORE_ADDR,
//   KEEL_SLOT (the machine; its recorded defect, robust/fault_injector.h, is armed),
//   KEEL_LOCAL_WORLD_SIZE.
// What it leaves in the job's store, at keys::replay_result_key(K), a store::ReplayResult:
//   from group rank 0: the step's loss and the digest (16 hex digits: the block digest of
//   every rank's state digests, params, adam_m, adam_v, after the step, in rank order);
//   or the error "<rank>: <what>" of the first rank that failed (claimed with
//   add(keys::replay_errors_key(K), 1) == 1, so a peer's later timeout does not hide it).
// The group's communicators meet under keys::replay_groups_prefix(K), so no two groups (nor
// the job) ever share a rendezvous key.
#pragma once

#include "launcher/worker_options.h"

namespace keel {

// Runs this replay worker (JobEnv's replay_key must be set). Returns the exit code: 0 with the
// digest published (rank 0) or the step done, 1 after publishing an error.
int run_replay_worker(const WorkerOptions& o);

}  // namespace keel
