// How a rank joins an epoch (DESIGN.md, Recovery protocol): its communicators, its Trainer,
// and its state at the controller's restore step, from where the Rebuild says or from the
// rank's own copies; a survivor whose id the Rebuild changes lays its state out again, and
// a rank of a grown replica receives it from its DP group.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>

#include "ckpt/checkpoint_reshard.h"
#include "ckpt/restore.h"
#include "launcher/worker/worker_impl.h"
#include "model/job_layout.h"
#include "model/llmc_checkpoint.h"
#include "proto/store_keys.h"
#include "runtime/logging.h"

namespace keel::worker_detail {

void Worker::start_state(const std::optional<membership::Rebuild>& rb) {
  // A restarted rank (or a promoted standby) joins the epoch the supervisor started for
  // it, at the step everyone restores, in the layout of its Rebuild (read in setup()).
  if (env_.restarted) {
    adopt_current_plugin();
    KEEL_CHECK(rb.has_value(), "rank ", o_.rank, " was restarted without a controller");
    epochs_.join(env_.epoch, &*rb);
  } else {
    epochs_.join(env_.epoch, nullptr);
  }
  updates_->start();
  if (leader_ && !o_.quiet && !env_.restarted && epoch() == 0)
    std::printf(
        "keel: %s %s, %lld params, %s on %d rank(s), %d micro-batch(es) of %d per step, "
        "backend %s\n",
        plugin_->name().c_str(), plugin_->version().c_str(),
        static_cast<long long>(trainer_->global_param_count()),
        layout_name(members_.topo()).c_str(), members_.topo().world_size(),
        trainer_->micro_batches(), cfg_.train().micro_batch_size(), backend_->name().c_str());
}

EpochRunner::Steps Worker::epoch_steps() {
  EpochRunner::Steps st;
  st.take_rebuild = [this](const membership::Rebuild& rb) { take_rebuild(rb); };
  // Peers read its backup server's address during their restore.
  st.before_rendezvous = [this] { snapshots_->publish_address(*store_, epoch(), o_.rank); };
  st.make_groups = [this](const std::atomic<bool>* cancel) { return make_groups(epoch(), cancel); };
  st.wrap = [this](ProcessGroups& g) {
    if (injector_) injector_->wrap(g, activity());
  };
  st.rebind = [this](ProcessGroups* g) {
    if (trainer_) trainer_->rebind(g);
  };
  st.load = [this](const membership::Rebuild* rb) { load_epoch(rb); };
  st.steps_done = [this] { return state_->step(); };
  return st;
}

void Worker::take_rebuild(const membership::Rebuild& rb) {
  // A survivor (it has a Trainer from the epoch before) whose id the controller changed
  // re-lays its state out; every other rank takes the epoch's Membership as it is.
  if (recovery_ && trainer_ && !rb.renumber().empty()) {
    auto n = rb.renumber().find(o_.rank);
    KEEL_CHECK(n != rb.renumber().end(), "rank ", o_.rank, " is retired in epoch ", epoch(),
               " but still running");
    if (rb.has_reshard_from())
      reshape(n->second, rb);
    else
      relayout(n->second, rb);
  } else {
    apply_membership(rb.membership());
    // A rank started on a standby as the job grows back into a larger layout.
    if (rb.has_reshard_from()) read_old_layout(o_.rank, rb, *state_);
  }
  // The epoch's plugin (a lazy update applied with it, or a rollback of a failed one).
  adopt_plugin(rb.plugin_path(), rb.plugin_hash());
}

void Worker::load_epoch(const membership::Rebuild* rb) {
  if (snapshots_->reopen_pending())  // every rank has passed its rendezvous
    snapshots_->reopen(o_.rank, members_.topo(), state_.get(), *store_, epoch(), injector_.get(),
                       checkpoint_layout());
  if (!trainer_) make_trainer();
  backend_->keep_freed_blocks(false);  // a promoted standby's rehearsal has served
  // Growing back: every rank of the epoch takes part in its replica's broadcast.
  const bool grow = rb && rb->new_ranks_size() > 0 && !rb->has_reshard_from();
  if (grow) receive_state_from_replica();
  round_meter_.new_epoch();
  if (reporter_) {
    reporter_->set_epoch(epoch());
    reporter_->set_steps(state_->step());
  }
  snapshots_->use_holder(*store_, epoch(), comm_timeout());
  if (!rb) {
    load_start_state();
    sdc_->start(sdc_rank());
  } else if (!grow) {
    restore(*rb);
  }
  // Where the report starts, claimed once: by the first epoch's rank 0, or, when a failure
  // ended that epoch before its rank 0 claimed it (no step was run), by the next one's at the
  // state it restored (the start state).
  if (leader_) JobRecord::claim_start_step(*store_, state_->step());
  if (leader_) record_->flush(*store_);  // the steps before the failure, whatever restores
  record_->new_epoch(epoch());
}

void Worker::make_trainer() {
  trainer_ = std::make_unique<Trainer>(cfg_, backend_.get(), plugin_, members_.topo(), o_.rank,
                                       state_.get(), epochs_.groups().get(), data_.get());
  TrainerHooks th;
  th.before_update = [this](int64_t s) {
    if (snapshots_->snapshotter()) snapshots_->snapshotter()->wait_idle();
    sdc_->before_update(s, sdc_rank());
  };
  if (injector_)
    th.local_metrics = [this](int64_t s, float* m) { injector_->on_local_metrics(s, m); };
  // Only a job with an sdc fault pays for the hook (it reads a step's first gradient before
  // any of it is reduced), and on every rank alike.
  if (injector_ && sdc_->injected())
    th.computed = [this](int64_t s, TensorClass cls, float* d, size_t n, bool re) {
      injector_->on_computed(s, cls, d, n, re);
    };
  trainer_->set_hooks(th);
}

ProcessGroups Worker::make_groups(int epoch, const std::atomic<bool>* cancel) {
  ProcessGroupOptions g;
  g.epoch = epoch;
  g.timeout = comm_timeout();
  g.device = backend_->kind();
  g.cuda_device = o_.rank % std::max(1, o_.local_world_size);
  g.host = listen_host_;
  g.cancel = cancel;
  ProcessGroups groups = make_process_groups(members_.topo(), o_.rank, store_, g);
  if (auto a = activity()) trace_communicators(groups, a);
  return groups;
}

void Worker::receive_state_from_replica() {
  StateRewrite rw(*state_);
  for (const StateSpan& sp : state_->spans()) groups().dp->broadcast(sp.data, sp.bytes(), 0);
  int64_t step = state_->step();
  groups().dp->broadcast(&step, sizeof(step), 0);
  state_->set_step(step);
  rw.commit();
}

CheckpointLayout Worker::checkpoint_layout() const {
  const Topology& t = members_.topo();
  CheckpointLayout l;
  l.tp = t.tp();
  l.pp = t.pp();
  l.dp = t.dp();
  l.zero1 = cfg_.parallel().zero1();
  l.plugin_name = plugin_->name();
  l.plugin_version = plugin_->version();
  l.plugin_file = plugin_->path();
  l.lineage = env_.lineage;
  l.model = describe_model(cfg_);
  l.global_batch_size = cfg_.train().global_batch_size();
  return l;
}

void Worker::relayout(int rank, const membership::Rebuild& rb) {
  restore(rb);  // still under the old layout
  snapshots_->close(o_.rank);
  apply_membership(rb.membership());
  auto next = make_train_state(cfg_, backend_.get(), *plugin_, members_.topo(), rank);
  std::vector<StateSpan> from = state_->spans(), to = next->spans();
  for (size_t i = 0; i < from.size(); ++i)
    backend_->copy(to[i].data, from[i].data, std::min(from[i].bytes(), to[i].bytes()));
  next->set_step(state_->step());
  take_id(rank, std::move(next));
}

void Worker::take_id(int rank, std::unique_ptr<TrainState> next) {
  o_.rank = rank;
  o_.world_size = members_.topo().world_size();
  leader_ = rank == 0;
  trainer_.reset();  // it borrowed the old state
  state_ = std::move(next);
  if (recovery_) recovery_->set_rank(rank);
  if (reporter_) reporter_->set_rank(rank);
  updates_->set_rank(rank);
  JobRecord::register_pid(*store_, o_.rank, int(getpid()));
}

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
      if (!o_.resume_dir.empty()) {
        // The user's resume: past train.steps it is refused here, before any step.
        const std::string warning = check_resume(p, cfg_);
        if (!warning.empty() && leader_ && !env_.restarted) LOG(WARNING) << warning;
      }
      StateRewrite rw(*state_);
      load_state(p, *plugin_, cfg_, members_.topo(), o_.rank, *state_);
      rw.commit();
      if (leader_ && !o_.quiet)
        std::printf("keel: resumed from %s (step %lld, written at tp %d pp %d dp %d%s)\n",
                    p.dir.c_str(), static_cast<long long>(p.step), p.manifest.tp(), p.manifest.pp(),
                    p.manifest.dp(), p.manifest.zero1() ? " zero1" : "");
      return;
    } catch (const InputError&) {
      if (!o_.resume_dir.empty()) throw;  // asked for by the user: it must be there
    }
  }
  StateRewrite rw(*state_);
  trainer_->init_params();
  rw.commit();
}

void Worker::restore(const membership::Rebuild& rb) {
  const int64_t S = rb.restore_step();
  membership::Source source;  // the incident's
  std::string from;           // what the log says
  if (rb.source() == membership::persistent) {
    if (snapshots_->snapshotter()) snapshots_->snapshotter()->wait_idle();
    const std::string dir =
        rb.checkpoint_dir().empty() ? cfg_.checkpoint().dir() : rb.checkpoint_dir();
    const ResumePoint p = find_resume_point(dir, checkpoint_layout());
    if (p.step != S)
      throw Error(detail::concat("the controller restores the persistent checkpoint of step ", S,
                                 " but the newest complete one in ", dir, " is step ", p.step));
    StateRewrite rw(*state_);
    load_state(p, *plugin_, cfg_, members_.topo(), o_.rank, *state_);
    rw.commit();
    source = membership::persistent;
    from = "the persistent checkpoint " + p.dir;
  } else if (S < 0) {
    load_start_state();
    source = membership::scratch;
    from = "the job's start state";
  } else if (state_->step() == S) {
    source = membership::memory;  // a step is a transaction: the state is still S
  } else {
    const SnapshotSet::Restored r =
        snapshots_->restore_own(*state_, S, o_.rank, *store_, epoch(), comm_timeout());
    source = r.source;
    from = r.from;
  }
  if (snapshots_->snapshotter() && S >= 0) snapshots_->snapshotter()->forget_after(S);
  if (recovery_) recovery_->restored_from(epoch(), source);
  if (!from.empty()) LOG(INFO) << "rank " << o_.rank << ": restored step " << S << " from " << from;
}

}  // namespace keel::worker_detail
