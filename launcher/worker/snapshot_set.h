// A rank's copies of its state (DESIGN.md, Snapshots and checkpoints): its snapshot region in
// shared memory and the snapshotter that fills it after every step, the backup server that
// keeps the snapshots of the rank it backs up (its address in the store,
// backup_addr/<E>/<rank>, store::Endpoint), and the persistent checkpointer. It opens them
// under the rank's id (again after the id changed), restores a step from the rank's own
// copies, settles a failed checkpoint under checkpoint.on_write_error: stop, and reports
// what they cost.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "ckpt/backup_service.h"
#include "ckpt/persistent_checkpoint.h"
#include "ckpt/snapshot_region.h"
#include "ckpt/snapshotter.h"
#include "model/train_state.h"
#include "parallel/communicator.h"
#include "parallel/store.h"
#include "parallel/topology.h"
#include "proto/config.pb.h"
#include "proto/membership.pb.h"
#include "proto/report.pb.h"
#include "robust/fault_injector.h"

namespace keel {

struct SnapshotSetOptions {
  std::string job;                                  // names the shared-memory segments
  std::string listen_host = "127.0.0.1";            // where the backup server listens
  config::CheckpointConfig checkpoint;              // the job's checkpoint section
  bool zero1 = false;                               // parallel.zero1 (who may hold a backup)
  int slot = -1;                                    // the machine, for incidents (-1: none)
  std::function<std::shared_ptr<Store>()> connect;  // store clients for the checkpointer
  // A rank joining a running job (restarted, or a promoted standby): a new segment's slots
  // are faulted in behind its restore instead of before it (SnapshotRegion::open_or_create).
  bool joining = false;
};

class SnapshotSet {
 public:
  explicit SnapshotSet(SnapshotSetOptions o) : o_(std::move(o)) {}
  ~SnapshotSet();
  SnapshotSet(const SnapshotSet&) = delete;
  SnapshotSet& operator=(const SnapshotSet&) = delete;

  // The snapshot region, the backup server for the rank this one backs up (its address
  // published for `epoch`) and the snapshotter, for rank `rank` of `topo`. Nothing without
  // checkpoint.snapshot_every_step. `injector` (may be null) gets the snapshot fault actions.
  void open(int rank, const Topology& topo, TrainState* state, Store& store, int epoch,
            FaultInjector* injector);
  // The persistent checkpointer (checkpoint.persistent_every_steps > 0).
  void open_checkpointer(int rank, const CheckpointLayout& layout);
  // The rank's id changes: stops and drops everything, its segments' names included (a
  // checkpoint in flight is abandoned: a rank lost in the failure never publishes its part).
  // They reopen under the new id with reopen(), after the next rendezvous.
  void close(int rank);
  // close() was called and nothing is open yet.
  bool reopen_pending() const { return reopen_; }
  // Every rank of the new layout has passed its rendezvous, so every old name is let go:
  // names of the new id left by retired ranks are stale. Removes them and opens everything
  // again for rank `rank` (open() and open_checkpointer()).
  void reopen(int rank, const Topology& topo, TrainState* state, Store& store, int epoch,
              FaultInjector* injector, const CheckpointLayout& layout);

  // Publishes the backup server's address for `epoch` (if the rank has one).
  void publish_address(Store& store, int epoch, int rank) const;
  // The epoch's backup holder takes the pushes (a replica holds the same state: no pushes).
  void use_holder(Store& store, int epoch, std::chrono::milliseconds timeout);

  // Where restore_own found the step: the rank's own snapshot or its holder's backup.
  struct Restored {
    membership::Source source = membership::own_snapshot;
    std::string from;  // what the log says
  };
  // Loads snapshot `step` into `state` from the rank's own slots (in place when the state
  // lives in them) or else from its backup holder. Throws RestoreError if neither has it.
  Restored restore_own(TrainState& state, int64_t step, int rank, Store& store, int epoch,
                       std::chrono::milliseconds timeout);

  // checkpoint.on_write_error: stop. Every step the ranks take the worst outcome of their
  // newest saves over `world` (null: a rank alone). True once, when a save failed: the job
  // stops after this step on every rank alike.
  bool settle(Communicator* world);
  // A save failed and the job stops (settle() returned true once).
  bool stopped() const { return stopped_; }
  // The job's end: the last save sealed or abandoned, on every rank alike (`world` barrier).
  void finish(bool leader, Communicator& world);

  // The report's snapshot figures.
  void fill_report(report::RunReport* rep, const TrainState& state, bool sdc_on, int rank) const;

  Snapshotter* snapshotter() const { return snapshotter_.get(); }
  SnapshotRegion* region() const { return region_.get(); }
  PersistentCheckpointer* checkpointer() const { return checkpointer_.get(); }

 private:
  std::string holder_address(Store& store, int epoch, std::chrono::milliseconds timeout) const;
  void unlink_names(int rank) const;

  SnapshotSetOptions o_;
  std::unique_ptr<SnapshotRegion> region_;
  std::unique_ptr<BackupServer> backup_server_;
  std::unique_ptr<Snapshotter> snapshotter_;
  std::unique_ptr<PersistentCheckpointer> checkpointer_;
  int holder_ = -1;
  bool replica_holder_ = false;  // holder_ is a DP replica: its own snapshot is the backup
  bool stopped_ = false;
  bool reopen_ = false;  // closed for a new id: reopens after the rendezvous
};

}  // namespace keel
