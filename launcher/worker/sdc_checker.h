// A rank's part in the silent data corruption checks (DESIGN.md, Determinism): at a check
// step it recomputes another replica's first micro-batch before the step, and before the
// step's update (the state still the step's start) it gathers every rank's digests, asks
// robust/sdc_check.h what they mean (third opinions and the golden mini-GPT included), and
// either keeps the state as verified or leaves the verdict for the controller, which evicts
// and rolls back, and throws SdcFound on every rank alike. It keeps the checks' bookkeeping:
// their time, the newest verified step, what they cover and what they missed.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/snapshot_region.h"
#include "ckpt/snapshotter.h"
#include "launcher/worker/progress_reporter.h"
#include "launcher/worker/step_loop.h"
#include "model/trainer.h"
#include "parallel/communicator.h"
#include "parallel/store.h"
#include "proto/report.pb.h"
#include "robust/fault_injector.h"
#include "robust/golden_check.h"
#include "robust/sdc_check.h"

namespace keel {

// Thrown on every rank alike when a check found corruption, before the step's update: the
// recovery protocol takes over as after a failed collective, and the controller reads the
// verdict the ranks left in the store (sdc/verdict/<E>).
class SdcFound : public RecoverableFailure {
 public:
  using RecoverableFailure::RecoverableFailure;
};

// What a check works on, borrowed for one call: the rank's objects in its current epoch.
struct SdcRank {
  Trainer* trainer = nullptr;
  TrainState* state = nullptr;
  Communicator* world = nullptr;  // the epoch's world group
  const Topology* topo = nullptr;
  int rank = 0;
  int epoch = 0;
  bool leader = false;  // rank 0: keeps the job's figures in the store
  bool quiet = false;
  Store* store = nullptr;
  SnapshotRegion* region = nullptr;      // null without snapshots (no check at rest)
  Snapshotter* snapshotter = nullptr;    // keeps the verified state; may be null
  ProgressReporter* reporter = nullptr;  // may be null
};

class SdcChecker {
 public:
  // `every`: sdc.check_every_steps (<= 0: off). `zero1`: parallel.zero1 (the moments are
  // shards, not compared). `injected`: the fault plan holds an sdc fault, so the Trainer's
  // computed hook is on (only such a job pays for it). `golden` runs the golden mini-GPT
  // through this rank's unit when replicas tie.
  SdcChecker(int every, bool zero1, bool injected, std::function<GoldenCheckResult()> golden);

  // The job's start state is its first verified one.
  void start(const SdcRank& r);
  // Before step s: at a check step, recompute the target replica's first micro-batch and
  // have the Trainer record its own.
  void before_step(int64_t s, const SdcRank& r);
  // Before step s's update: gather, judge, and either keep the state as verified or leave
  // the verdict and throw SdcFound.
  void before_update(int64_t s, const SdcRank& r);
  // The recomputation's time before the step just run, outside the Trainer's clock: the
  // step's time all the same. Returns it once.
  double take_before_step_seconds() { return std::exchange(before_step_s_, 0.0); }
  // A step took `wall_s` seconds (for the checks' share of the time).
  void step_done(double wall_s) { steps_wall_s_ += wall_s; }

  int every() const { return every_; }
  bool injected() const { return injected_; }
  // The step of the newest check this rank saw pass (-1: none).
  int64_t last_passed() const { return last_passed_; }
  double seconds() const { return seconds_; }
  // Rank 0: adds to the job's count the checks a store out of reach (etcd slow or without
  // quorum on the step path's short deadline) left uncounted; before the report reads it.
  void count_the_rest(Store& store);
  // The checks' time as a share of the steps' (0 before any step).
  double share() const { return steps_wall_s_ > 0 ? seconds_ / steps_wall_s_ : 0; }
  // One line: what the checks compare on layout `topo` and what they cannot see; `at_rest`:
  // the rank has snapshots to check its state against.
  std::string coverage(const Topology& topo, bool at_rest) const;
  // Injected sdc faults no incident of `rep` caught, and why (the report's sdc_missed).
  std::vector<std::string> missed(const std::vector<InjectionRecord>& injections,
                                  const report::RunReport& rep, const Topology& topo) const;

 private:
  [[noreturn]] void found(int64_t s, const sdc::Verdict& v, const SdcRank& r);

  int every_;
  bool zero1_;
  bool injected_;
  std::function<GoldenCheckResult()> golden_;
  bool armed_ = false;  // this step is a check step and its recompute is done
  MicroBatchDigest recomputed_;
  int64_t last_passed_ = -1;
  double seconds_ = 0;        // this rank's time in checks
  double steps_wall_s_ = 0;   // this rank's time in steps
  int64_t uncounted_ = 0;     // rank 0: passed checks kSdcChecks does not have yet
  double before_step_s_ = 0;  // this step's recomputation, before the Trainer's clock
};

}  // namespace keel
