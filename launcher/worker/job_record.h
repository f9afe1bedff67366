// What rank 0 writes down about the job while it runs, in the job's store so that it
// outlives the rank (a crash, a restart_all): each step's numbers (step/<S>), the steps done
// (progress), the figures for keel-ctl status (live), when each epoch's first step ended
// (first_step/<E>), validation losses (eval/<S>), the step the report starts at
// (start_step), the NaN incidents it handled alone, and every rank's PIDs. job_history.h
// reads it back for the report. The steps' records, the progress and the live figures go in
// batches, once a second (and at an epoch's first step, and at the end): the store may be the
// job's etcd, where every write is a Raft entry, and nothing on the step path may cost one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launcher/worker/mfu.h"
#include "model/trainer.h"
#include "parallel/store.h"
#include "proto/report.pb.h"
#include "proto/store_values.pb.h"

namespace keel {

class JobRecord {
 public:
  // How often the batch goes to the store: keel-ctl status's figures and the stop rules'
  // progress are at most this old, and a rank 0 that dies takes at most this much of the
  // steps' records with it.
  static constexpr double kFlushEverySeconds = 1.0;

  // `supervised`: a controller runs the job (and shows the live figures); `job_start`: unix
  // seconds the job started (for the ETTR so far).
  JobRecord(bool supervised, double job_start) : supervised_(supervised), job_start_(job_start) {}

  // A process of rank `rank` runs: its PID joins the rank's list (pids/<rank>/...).
  static void register_pid(Store& store, int rank, int pid);
  // The step the job's report starts at: where its first process started, kept once.
  static void claim_start_step(Store& store, int64_t step);
  // The validation loss after `steps` steps.
  static void eval(Store& store, int64_t steps, double loss);

  // The record of step `st` as this rank saw it in `epoch`, ended now (every rank sees the
  // same loss, gradient norm and learning rate; the times are its own).
  static report::StepRecord record_of(const StepStats& st, int epoch);

  // The rank is in `epoch` now: its next step is the epoch's first.
  void new_epoch(int epoch);
  // Rank 0's step `st` is done: its record, the progress, the live figures (MFU from
  // `model_flops_per_token` and `peak`), the epoch's first step, and the NaN incident of a
  // retried step once the retry is through; written to `store` with the batch.
  void step(Store& store, const StepStats& st, double model_flops_per_token, const Peak& peak);
  // Writes what is batched now (before the report reads it back).
  void flush(Store& store);

  // A step's loss or norm was not finite. Returns false when step `s` was retried already
  // (every rank sees the same global numbers, so every rank then stops alike); otherwise
  // remembers the retry, and on rank 0 (`leader`) the incident it becomes once it succeeds.
  bool retry_nonfinite(int64_t s, bool leader, const std::string& what);

 private:
  bool supervised_;
  double job_start_;
  int epoch_ = 0;
  bool first_step_in_epoch_ = true;
  double live_step_s_ = 0;  // time in steps so far
  double flushed_at_ = 0;   // when the batch last went to the store (unix seconds)
  // The batch: step records by step (a step run again after a rollback replaces its record
  // and drops the later ones: etcd refuses a write that names a key twice, and a rolled-back
  // attempt's record must not land after the rerun's), and the other keys.
  std::map<int64_t, std::string> steps_;
  std::vector<std::pair<std::string, std::string>> others_;
  store::Step progress_;  // steps done, and the live figures, as of the newest step
  store::Live live_;
  int64_t nonfinite_retried_ = -1;
  report::Incident nan_incident_;
};

}  // namespace keel
