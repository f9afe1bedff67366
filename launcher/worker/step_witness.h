// The witness of rank 0's step records (runs in one rank's keel-worker): rank 0 writes each
// step's record (launcher/worker/job_record.h) in batches a second apart, so a rank 0 that
// dies (its slot lost, its process killed) takes the steps since its last batch with it, and
// longer stretches when etcd was out of reach. Every rank computes the same loss and gradient
// norm (one world all-reduce), so one rank on another machine keeps the same records in
// memory; when a failure ends an epoch it writes those that rank 0's batches did not bring to
// the store (step_copy/<S>), and the report reads the newer epoch's of a step's record and
// copy. Nothing is written while the job trains: no etcd write per step.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>

#include "parallel/store.h"
#include "proto/membership.pb.h"
#include "proto/report.pb.h"

namespace keel {

// The rank that witnesses rank 0's records in `m`: the lowest rank on a slot other than
// rank 0's; without a placement (keel-worker --nproc) rank 1; -1 in a job of one rank or of
// one slot only.
int record_witness(const membership::Membership& m);

class StepWitness {
 public:
  // How many records are kept: rank 0 writes a batch a second, so this covers an etcd outage
  // far longer than detect.quorum_timeout_ms at any step rate keel reaches.
  static constexpr size_t kKept = 8192;

  // Step `r.step()` is done on this rank: its record is kept, and a write owed since a
  // failure is tried again (at most once a second).
  void step(Store& store, const report::StepRecord& r);
  // An epoch ended by a failure: writes the kept records that rank 0's progress does not
  // cover (step_copy/<S>, one batch): those of another epoch than its progress's, and its
  // epoch's from that progress on; then forgets them. Returns false when the store did not
  // take it (etcd without quorum): the records stay kept, and the next call tries again.
  bool write_missing(Store& store);
  // Whether a write is owed since a failure (the last write_missing did not get through).
  bool owed() const { return owed_; }

 private:
  std::deque<report::StepRecord> kept_;  // in step order, a step run again replacing its own
  bool owed_ = false;
  std::chrono::steady_clock::time_point tried_at_;  // the last write_missing
};

}  // namespace keel
