// One process of the stop-time diagnostics (DESIGN.md, Failure handling, rung 2): while the
// job's workers are parked in the recovery wait, the controller starts one of these on the
// slot of each job rank to check (the suspects and every peer of their TP, PP and DP groups).
// It stands in for that rank: it checks the machine's device (GEMM against a double-precision
// reference), trains keel's golden mini-GPT whatever model the job trains (bitwise against the
// repository's digest) and, with the stand-ins of the rank's peers, runs an all-reduce per
// group that must add up exactly, measuring its own send rate. robust/diagnostics.h judges the
// answers.
//
// Started by the agent like a training worker (the same argv) with, in the environment,
//   KEEL_DIAGNOSE=<key>  the diagnosis's store key K (keys::diagnose_key); its task at
//                        keys::diagnose_task_key(K), a store::DiagnoseTask: the job's epoch,
//                        the job rank each stand-in stands for (job_ranks[KEEL_RANK]) and the
//                        suspects (only the rank's groups that hold one are tested: their
//                        members all have stand-ins; none: every group of size > 1)
//   KEEL_RANK, KEEL_WORLD_SIZE (its index among the stand-ins and their number),
//   KEEL_STORE_ADDR, KEEL_SLOT (the machine: its recorded sdc defect is armed, and a recorded
//   link defect, robust/fault_injector.h, makes it break its own links), KEEL_LOCAL_WORLD_SIZE.
// The job's layout is the Membership of the task epoch's Rebuild (rebuild/<E>), never the
// environment. The group of kind K (tp, pp, dp) whose topology name is N meets under
// "<key>/K/N/" in the job's store. The answer, a report::Diagnostic, goes to
// keys::diagnose_result_key(K, job rank).
// A group test fails with the job rank whose connection broke as blamed_rank; a stand-in
// that broke its own links names itself. Each group test has a few seconds (its share of
// three quarters of recovery.diagnostics_timeout_ms, at least one second), so the answer is
// in before the controller's budget ends even when a peer never comes.
#pragma once

#include "launcher/worker_options.h"

namespace keel {

// Runs this diagnostic process (JobEnv's diagnose_key must be set). Returns the exit code: 0 with
// its answer published, 1 when it could not run its checks (the answer then carries the error).
int run_diagnose_worker(const WorkerOptions& o);

}  // namespace keel
