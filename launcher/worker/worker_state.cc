#include "launcher/worker/worker_impl.h"

#include "runtime/logging.h"

namespace keel::worker_detail {

// The rank's snapshot region, the backup server for the rank it holds a backup of, and the
// snapshotter, under the rank's id (again after the id changed).
void Worker::open_snapshots() {
  if (!cfg_.checkpoint().snapshot_every_step()) return;
  region_ = SnapshotRegion::open_or_create(snapshot_segment_name(env_.job, o_.rank),
                                           state_->bytes(), state_->layout_fingerprint(), o_.rank);
  const BackupPlacement bp =
      backup_holder(topo_, o_.rank, replicas_hold_backups(topo_, cfg_.parallel().zero1()));
  holder_ = bp.holder;
  replica_holder_ = bp.replica;
  if (holder_ >= 0) {
    // Also for a replica holder: this rank's server then serves its own snapshot to the
    // replica it backs up.
    BackupServerOptions bo;
    bo.host = listen_host_;
    bo.serve_own_snapshot = replica_holder_;
    backup_server_ = std::make_unique<BackupServer>(env_.job, o_.rank, bo);
    store_->set(keys::backup_addr_key(epoch_, o_.rank), backup_server_->address());
  }
  snapshotter_ = std::make_unique<Snapshotter>(state_.get(), region_.get());
  if (injector_)
    injector_->set_snapshot_actions(snapshot_fault_actions(snapshotter_.get(), region_.get()));
}

void Worker::open_checkpointer() {
  if (cfg_.checkpoint().persistent_every_steps() <= 0) return;
  PersistentCheckpointOptions po;
  po.dir = cfg_.checkpoint().dir();
  po.rank = o_.rank;
  po.layout = checkpoint_layout();
  po.keep = cfg_.checkpoint().keep();
  // An incident of its own, in the job's store at once (the report reads it back), never a
  // failure of the rank: training goes on, protected by the in-memory snapshots.
  po.on_write_failed = [connect = connect_,
                        stop = cfg_.checkpoint().on_write_error() == config::CheckpointConfig::stop,
                        every = cfg_.checkpoint().persistent_every_steps()](
                           const CheckpointWriteFailure& f) {
    report::Incident inc;
    inc.set_kind("checkpoint_write_failed");
    inc.set_rank(f.rank);
    inc.set_slot(std::getenv("KEEL_SLOT") ? std::atoi(std::getenv("KEEL_SLOT")) : -1);
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
      store->set(keys::incident_key(n), inc.SerializeAsString());
    } catch (const std::exception& e) {
      LOG(WARNING) << "rank " << f.rank << ": cannot record the checkpoint incident: " << e.what();
    }
  };
  checkpointer_ = std::make_unique<PersistentCheckpointer>(po, connect_);
}

// The job's data parallelism shrank or grew: this surviving rank becomes `rank` of a layout
// with `dp` replicas. Its state is the same (replicas are equal without ZeRO-1), laid out
// again (the flat buffers are padded to a multiple of dp); its snapshot names move to the
// new id after the next rendezvous, when every rank has let go of its old ones.
void Worker::relayout(int rank, int dp, const membership::Rebuild& rb) {
  restore(rb);  // still under the old layout
  if (snapshotter_) snapshotter_->stop();
  snapshotter_.reset();
  backup_server_.reset();
  region_.reset();
  if (cfg_.checkpoint().snapshot_every_step()) {
    shm_unlink(snapshot_segment_name(env_.job, o_.rank).c_str());
    shm_unlink(backup_segment_name(env_.job, o_.rank).c_str());
  }
  if (checkpointer_) {
    // A rank lost in the failure that led here never publishes its part of a step in flight.
    checkpointer_->abandon_unsealed();
    checkpointer_->wait();
  }
  checkpointer_.reset();
  cfg_.mutable_parallel()->set_dp(dp);
  topo_ = Topology(cfg_.parallel().tp(), cfg_.parallel().pp(), dp);
  o_.rank = rank;
  o_.world_size = topo_.world_size();
  leader_ = rank == 0;
  auto next = make_train_state(cfg_, backend_.get(), *plugin_, topo_, rank);
  std::vector<StateSpan> from = state_->spans(), to = next->spans();
  for (size_t i = 0; i < from.size(); ++i)
    backend_->copy(to[i].data, from[i].data, std::min(from[i].bytes(), to[i].bytes()));
  next->set_step(state_->step());
  trainer_.reset();  // it borrowed the old state
  state_ = std::move(next);
  if (recovery_) recovery_->set_rank(rank);
  if (reporter_) reporter_->set_rank(rank);
  register_pid();
  relaid_out_ = true;
}

void Worker::register_pid() {
  const std::string pids = "pids/" + std::to_string(o_.rank) + "/";
  store_->set(pids + std::to_string(store_->add(pids + "count", 1) - 1), std::to_string(getpid()));
}

// The state the job starts from: --resume (or, after restart_all, the newest checkpoint),
// model.init_checkpoint, or a fresh init.
void Worker::load_start_state() {
  std::string dir = !o_.resume_dir.empty() ? o_.resume_dir : env_.resume_latest;
  if (!dir.empty()) {
    std::vector<std::string> skipped;
    try {
      CheckpointLayout layout = checkpoint_layout();
      if (!o_.resume_dir.empty()) layout.lineage.clear();  // the user named it: any run's
      ResumePoint p = find_resume_point(dir, layout, &skipped);
      for (const auto& s : skipped)
        LOG(WARNING) << "rank " << o_.rank << ": skipped checkpoint " << s;
      StateRewrite rw(*state_);
      load_rank(p, o_.rank, *state_);
      rw.commit();
      if (leader_ && !o_.quiet)
        std::printf("keel: resumed from %s (step %lld)\n", p.dir.c_str(),
                    static_cast<long long>(p.step));
      return;
    } catch (const InputError&) {
      if (!o_.resume_dir.empty()) throw;  // asked for by the user: it must be there
    }
  }
  StateRewrite rw(*state_);
  trainer_->init_params();
  rw.commit();
}

// The step the job's report starts at: where its first process started (a --resume
// point or 0), kept once for the whole job.
void Worker::record_start_step() {
  if (leader_ && store_->add("start_step/claimed", 1) == 1)
    store_->set("start_step", std::to_string(state_->step()));
}

// A grown replica's ranks get the state (and its step) from their DP group's first rank,
// which every survivor of the group holds equally.
void Worker::receive_state_from_replica() {
  StateRewrite rw(*state_);
  for (const StateSpan& sp : state_->spans()) groups_->dp->broadcast(sp.data, sp.bytes(), 0);
  int64_t step = state_->step();
  groups_->dp->broadcast(&step, sizeof(step), 0);
  state_->set_step(step);
  rw.commit();
}

void Worker::restore(const membership::Rebuild& rb) {
  const int64_t S = rb.restore_step();
  std::string source, from;  // the incident's name for it, and what the log says
  if (rb.source() == membership::persistent) {
    if (snapshotter_) snapshotter_->wait_idle();
    const std::string dir =
        rb.checkpoint_dir().empty() ? cfg_.checkpoint().dir() : rb.checkpoint_dir();
    const ResumePoint p = find_resume_point(dir, checkpoint_layout());
    if (p.step != S)
      throw Error(detail::concat("the controller restores the persistent checkpoint of step ", S,
                                 " but the newest complete one in ", dir, " is step ", p.step));
    StateRewrite rw(*state_);
    load_rank(p, o_.rank, *state_);
    rw.commit();
    source = "persistent";
    from = "the persistent checkpoint " + p.dir;
  } else if (S < 0) {
    load_start_state();
    source = "scratch";
    from = "the job's start state";
  } else if (state_->step() == S) {
    source = "memory";  // a step is a transaction: the state is still S
  } else {
    if (snapshotter_) snapshotter_->wait_idle();
    std::string why;
    if (snapshotter_ && snapshotter_->in_slots() && snapshotter_->adopt(S, &why)) {
      source = "own_snapshot";
      from = "own slot (" + region_->name() + "), in place";
    } else {
      if (!why.empty())
        LOG(WARNING) << "rank " << o_.rank << ": restore step " << S << ": own slot ("
                     << region_->name() << "): " << why;
      std::string addr = holder_ >= 0 && region_ ? holder_address() : "";
      // A state living in the slots was offered its own slot above; reading that slot again
      // into the other one could overwrite it.
      const bool in_slots = snapshotter_ && snapshotter_->in_slots();
      StateRewrite rw(*state_);
      RestoreResult r =
          restore_state(*state_, S, in_slots ? nullptr : region_.get(), addr, o_.rank, holder_);
      rw.commit(r.checksum);  // verified as it arrived: no second pass
      for (const auto& w : r.skipped)
        if (!in_slots || w.rfind("own slot:", 0) != 0)
          LOG(WARNING) << "rank " << o_.rank << ": restore step " << S << ": " << w;
      source = r.source.rfind("own", 0) == 0 ? "own_snapshot" : "backup";
      from = r.source;
    }
  }
  if (snapshotter_ && S >= 0) snapshotter_->forget_after(S);
  if (recovery_) store_->set(keys::restored_from_key(epoch_, o_.rank), source);
  if (!from.empty()) LOG(INFO) << "rank " << o_.rank << ": restored step " << S << " from " << from;
}

}  // namespace keel::worker_detail
