#include "launcher/worker/snapshot_set.h"

#include <sys/mman.h>

#include "ckpt/backup_placement.h"
#include "ckpt/restore.h"
#include "launcher/recovery_protocol.h"
#include "launcher/worker/fault_actions.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/logging.h"

namespace keel {

SnapshotSet::~SnapshotSet() {
  if (snapshotter_) snapshotter_->stop();
}

void SnapshotSet::open(int rank, const Topology& topo, TrainState* state, Store& store, int epoch,
                       FaultInjector* injector) {
  if (!o_.checkpoint.snapshot_every_step()) return;
  region_ = SnapshotRegion::open_or_create(snapshot_segment_name(o_.job, rank), state->bytes(),
                                           state->layout_fingerprint(), rank, o_.joining);
  const BackupPlacement bp = backup_holder(topo, rank, replicas_hold_backups(topo, o_.zero1));
  holder_ = bp.holder;
  replica_holder_ = bp.replica;
  if (holder_ >= 0) {
    // Also for a replica holder: this rank's server then serves its own snapshot to the
    // replica it backs up.
    BackupServerOptions bo;
    bo.host = o_.listen_host;
    bo.serve_own_snapshot = replica_holder_;
    backup_server_ = std::make_unique<BackupServer>(o_.job, rank, bo);
    publish_address(store, epoch, rank);
  }
  snapshotter_ = std::make_unique<Snapshotter>(state, region_.get());
  if (injector)
    injector->set_snapshot_actions(snapshot_fault_actions(snapshotter_.get(), region_.get()));
}

void SnapshotSet::open_checkpointer(int rank, const CheckpointLayout& layout) {
  const config::CheckpointConfig& c = o_.checkpoint;
  if (c.persistent_every_steps() <= 0) return;
  PersistentCheckpointOptions po;
  po.dir = c.dir();
  po.rank = rank;
  po.layout = layout;
  po.keep = c.keep();
  // An incident of its own, in the job's store at once (the report reads it back), never a
  // failure of the rank: training goes on, protected by the in-memory snapshots.
  po.on_write_failed = [connect = o_.connect, slot = o_.slot,
                        stop = c.on_write_error() == config::CheckpointConfig::stop,
                        every = c.persistent_every_steps()](const CheckpointWriteFailure& f) {
    report::Incident inc;
    inc.set_kind("checkpoint_write_failed");
    inc.set_rank(f.rank);
    inc.set_slot(slot);
    inc.set_step(int(f.step));
    inc.set_detected_at(recovery::unix_now());
    inc.set_epoch(-1);
    inc.set_detail(f.message());
    inc.set_rule("checkpoint_write");
    inc.set_action(
        stop ? "the job stops (checkpoint.on_write_error: stop)"
             : detail::concat("training goes on; the next checkpoint is step ", f.step + every));
    try {
      std::shared_ptr<Store> store = connect();
      const int64_t n = store->add(keys::kIncidentCount, 1) - 1;
      set_message(*store, keys::incident_key(n), inc);
    } catch (const std::exception& e) {
      LOG(WARNING) << "rank " << f.rank << ": cannot record the checkpoint incident: " << e.what();
    }
  };
  checkpointer_ = std::make_unique<PersistentCheckpointer>(po, o_.connect);
}

void SnapshotSet::close(int rank) {
  if (snapshotter_) snapshotter_->stop();
  snapshotter_.reset();
  backup_server_.reset();
  region_.reset();
  if (o_.checkpoint.snapshot_every_step()) unlink_names(rank);
  if (checkpointer_) {
    // A rank lost in the failure that led here never publishes its part of a step in flight.
    checkpointer_->abandon_unsealed();
    checkpointer_->wait();
  }
  checkpointer_.reset();
  reopen_ = true;
}

void SnapshotSet::reopen(int rank, const Topology& topo, TrainState* state, Store& store, int epoch,
                         FaultInjector* injector, const CheckpointLayout& layout) {
  unlink_names(rank);
  open(rank, topo, state, store, epoch, injector);
  open_checkpointer(rank, layout);
  reopen_ = false;
}

void SnapshotSet::unlink_names(int rank) const {
  shm_unlink(snapshot_segment_name(o_.job, rank).c_str());
  shm_unlink(backup_segment_name(o_.job, rank).c_str());
}

void SnapshotSet::publish_address(Store& store, int epoch, int rank) const {
  if (!backup_server_) return;
  store::Endpoint e;
  e.set_address(backup_server_->address());
  set_message(store, keys::backup_addr_key(epoch, rank), e);
}

std::string SnapshotSet::holder_address(Store& store, int epoch,
                                        std::chrono::milliseconds timeout) const {
  return get_message<store::Endpoint>(store, keys::backup_addr_key(epoch, holder_), timeout)
      .address();
}

void SnapshotSet::use_holder(Store& store, int epoch, std::chrono::milliseconds timeout) {
  // A replica holds the same state already: nothing to push.
  if (snapshotter_ && holder_ >= 0 && !replica_holder_)
    snapshotter_->set_backup_holder(holder_address(store, epoch, timeout));
}

SnapshotSet::Restored SnapshotSet::restore_own(TrainState& state, int64_t step, int rank,
                                               Store& store, int epoch,
                                               std::chrono::milliseconds timeout) {
  if (snapshotter_) snapshotter_->wait_idle();
  Restored out;
  std::string why;
  if (snapshotter_ && snapshotter_->in_slots() && snapshotter_->adopt(step, &why)) {
    out.source = membership::own_snapshot;
    out.from = "own slot (" + region_->name() + "), in place";
    return out;
  }
  if (!why.empty())
    LOG(WARNING) << "rank " << rank << ": restore step " << step << ": own slot ("
                 << region_->name() << "): " << why;
  const std::string addr = holder_ >= 0 && region_ ? holder_address(store, epoch, timeout) : "";
  // A state living in the slots was offered its own slot above; reading that slot again
  // into the other one could overwrite it.
  const bool in_slots = snapshotter_ && snapshotter_->in_slots();
  SnapshotRegion* own = in_slots ? nullptr : region_.get();
  StateRewrite rw(state);
  RestoreResult r = restore_state(state, step, own, addr, rank, holder_);
  rw.commit(r.checksum);  // verified as it arrived: no second pass
  // Without `own`, the first line passed over is the own slot's, already reported above
  // when the state lives in the slots.
  for (size_t i = in_slots ? 1 : 0; i < r.skipped.size(); ++i)
    LOG(WARNING) << "rank " << rank << ": restore step " << step << ": " << r.skipped[i];
  // restore_state tries `own` first and passes over nothing when it has the step.
  out.source = own && r.skipped.empty() ? membership::own_snapshot : membership::backup;
  out.from = r.source;
  return out;
}

bool SnapshotSet::settle(Communicator* world) {
  if (!checkpointer_ || o_.checkpoint.on_write_error() != config::CheckpointConfig::stop)
    return false;
  using Outcome = PersistentCheckpointer::Outcome;
  const Outcome o = checkpointer_->last_outcome();
  float worst = o == Outcome::kFailed ? 2.f : o == Outcome::kInFlight ? 1.f : 0.f;
  if (world) world->all_reduce(&worst, 1, ReduceOp::kMax);
  if (worst < 2 || stopped_) return false;
  stopped_ = true;
  return true;
}

void SnapshotSet::finish(bool leader, Communicator& world) {
  if (snapshotter_) snapshotter_->wait_idle();
  if (!checkpointer_) return;
  // Every rank that lives has published its part of the last save once it has waited for
  // its own write; a part still missing then belongs to a rank that failed while saving,
  // and rank 0 stops waiting for it.
  if (!leader) checkpointer_->wait();
  world.barrier();
  checkpointer_->abandon_unsealed();
  checkpointer_->wait();
}

void SnapshotSet::fill_report(report::RunReport* rep, const TrainState& state, bool sdc_on,
                              int rank) const {
  if (!snapshotter_) return;
  const SnapshotStats ss = snapshotter_->stats();
  rep->set_snapshot_blocked_s(ss.wait_idle_seconds);
  rep->set_snapshot_bytes(double(state.bytes()));
  rep->set_backup_bytes_per_step(ss.copies > 0 ? double(ss.bytes_pushed) / double(ss.copies) : 0);
  rep->set_snapshot_in_slots(snapshotter_->in_slots());
  rep->set_backup_mode(holder_ < 0 ? "none" : replica_holder_ ? "replica" : "pushed");
  double host = double(region_->mapped_bytes());
  if (!sdc_on) host -= double(region_->verified_slot_bytes());   // never touched
  if (!snapshotter_->in_slots()) host += double(state.bytes());  // the live state
  if (auto held = SnapshotRegion::open_existing(backup_segment_name(o_.job, rank)))
    host += double(held->mapped_bytes());
  rep->set_state_host_bytes(host);
  rep->set_state_host_ratio(host / double(state.bytes()));
}

}  // namespace keel
