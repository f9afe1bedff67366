// One rank's process: setup (config, the layout from its epoch's Rebuild, backend, plugin,
// data, TrainState, store, snapshots and the parts that hook into the step loop), the step
// loop with its hooks, and a failed step handed to the recovery protocol.
#include "launcher/worker/worker.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <utility>

#include "ckpt/snapshot_region.h"
#include "launcher/patient_store.h"
#include "launcher/worker/fault_actions.h"
#include "launcher/worker/input_checks.h"
#include "launcher/worker/rank_backend.h"
#include "launcher/worker/standby.h"
#include "launcher/worker/store_address.h"
#include "launcher/worker/worker_impl.h"
#include "parallel/hash_store.h"
#include "parallel/net_address.h"
#include "parallel/tcp_store.h"
#include "proto/config_loader.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/cpu/blas_core.h"
#include "runtime/cpu/cpu_features.h"
#include "runtime/logging.h"

namespace keel {
namespace worker_detail {
namespace {

// Ends the step loop early, on every rank at the same step: a persistent checkpoint failed
// and checkpoint.on_write_error is stop. The job still finishes (report, exports).
class CheckpointWriteStop : public Error {
 public:
  using Error::Error;
};

}  // namespace

RankEnv RankEnv::read() {
  const JobEnv& j = JobEnv::get();
  RankEnv e;
  e.job = j.job.empty() ? make_job_id() : j.job;  // its own job: removed at its end
  e.supervised = j.supervised;
  e.epoch = j.epoch;
  e.restarted = j.restarted;
  e.job_start = j.job_start > 0 ? j.job_start : unix_now();
  e.resume_latest = j.resume_latest;
  e.lineage = j.lineage.value_or(e.job);
  e.slot = j.slot;
  e.controller = j.controller;
  e.etcd = j.etcd;
  e.ifname = j.ifname;
  e.standby = j.standby;
  return e;
}

Worker::Worker(const WorkerOptions& o) : o_(o), env_(RankEnv::read()), epochs_(epoch_steps()) {}

Worker::~Worker() {
  if (updates_) updates_->stop();
  if (snapshots_ && snapshots_->snapshotter()) snapshots_->snapshotter()->stop();
  if (!env_.supervised) {
    snapshots_.reset();
    unlink_job_segments(env_.job);
  }
}

int Worker::run() {
  start_state(setup());
  StepHooks hooks;
  // First: the step's time for fail-slow detection covers every hook after it.
  hooks.before_step.push_back([this](int64_t) { round_meter_.begin_step(); });
  hooks.before_step.push_back([this](int64_t s) {
    if (injector_) injector_->before_step(s);
  });
  hooks.before_step.push_back([this](int64_t s) { update_before_step(s); });
  hooks.before_step.push_back([this](int64_t s) { sdc_->before_step(s, sdc_rank()); });
  hooks.after_step.push_back([this](const StepStats& st) { after_step(st); });
  hooks.on_error = [this](int64_t s, const std::exception& e) { return on_error(s, e); };
  try {
    run_step_loop([this]() -> Trainer& { return *trainer_; }, cfg_.train().steps(), hooks);
  } catch (const CheckpointWriteStop& e) {
    if (leader_) LOG(ERROR) << e.what();
  }
  finish();
  return exit_code_;
}

std::optional<membership::Rebuild> Worker::setup() {
  cfg_ = load_config(o_.config_path, o_.overrides);
  // Faults name ranks of the job as configured, also after its data parallelism changed.
  const int configured_world = cfg_.parallel().tp() * cfg_.parallel().pp() * cfg_.parallel().dp();
  FaultPlan plan;
  for (const auto& f : o_.faults) add_fault_flag(&plan, f);
  if (!o_.inject_path.empty()) add_fault_file(&plan, o_.inject_path);
  validate_fault_plan(plan, configured_world, cfg_.train().steps());
  for (const auto& f : plan.schedule.fault())
    if ((f.kind() == faults::Fault::slot_loss || f.kind() == faults::Fault::partition) &&
        env_.slot < 0)
      throw InputError(fault_kind_name(f.kind()) +
                       " faults need slots (machines): start the job with keel-launch");
  // A lone keel-worker has no supervisor to find a rank that stops and end it: the fault
  // would stall the process for good, not test a recovery.
  for (const auto& f : plan.schedule.fault())
    if ((f.kind() == faults::Fault::hang || f.kind() == faults::Fault::freeze) && !env_.supervised)
      throw InputError(fault_kind_name(f.kind()) +
                       " faults need a supervisor that finds the stopped rank and ends it "
                       "(keel-worker --nproc, or keel-launch): this keel-worker would wait "
                       "for ever");
  apply_membership(AppliedMembership::from_config(cfg_));
  connect_store();
  if (env_.supervised) {
    // The recovery protocol waits out a store out of reach (etcd without quorum) as the
    // controller does: a failure then is reported once it is back, not turned into a death.
    const auto patience = std::chrono::milliseconds(cfg_.detect().quorum_timeout_ms());
    recovery_ = std::make_unique<RecoveryClient>(
        [connect = connect_, patience] {
          return std::make_shared<PatientStore>(connect(), patience, std::function<void()>{});
        },
        o_.rank, env_.slot);
  }
  epochs_.set_recovery(recovery_.get());
  // Under a controller the layout is the Membership of the epoch's Rebuild (rebuild/0 too),
  // also for a rank restarted after the job shrank or grew.
  std::optional<membership::Rebuild> rb;
  if (recovery_ && !env_.standby) {
    rb = recovery_->wait_rebuild(env_.epoch);
    apply_membership(rb->membership());
  }
  check_job_inputs(o_, cfg_);
  const Topology& topo = members_.topo();
  if (topo.world_size() != o_.world_size)
    throw InputError(detail::concat(o_.config_path, ": parallel.tp·pp·dp = ", topo.world_size(),
                                    " (", layout_name(topo), ") but the job has ", o_.world_size,
                                    " rank(s); start it with --nproc ", topo.world_size()));
  round_meter_ = RoundMeter(cfg_.detect().slow_round_steps());
  backend_ = make_rank_backend(cfg_, o_.rank, o_.local_world_size);
  plugin_ = Plugin::load(cfg_.model().plugin());
  data_ = std::make_unique<DataLoader>(DataLoader::from_config(cfg_));
  if (cfg_.train().eval_every() > 0)
    val_ = std::make_unique<DataLoader>(DataLoader::from_config(cfg_, /*val=*/true));
  if (env_.standby) rb = park_as_standby();
  leader_ = o_.rank == 0;
  measure_peak();
  attach_supervision(plan);
  JobRecord::register_pid(*store_, o_.rank, int(getpid()));

  state_ = make_train_state(cfg_, backend_.get(), *plugin_, members_.topo(), o_.rank);
  // A rank started alone owns its shared memory: Ctrl-C, a kill or an exit fault, which skip
  // ~Worker, must not leave it behind; and its checkpoint directory (another job pointed at
  // it is refused at its start, told which job writes there).
  if (!env_.supervised) {
    own_segments_until_exit(env_.job, o_.rank);
    if (cfg_.checkpoint().persistent_every_steps() > 0)
      ckpt_lock_.emplace(cfg_.checkpoint().dir(), env_.job, env_.lineage);
  }
  SnapshotSetOptions so;
  so.job = env_.job;
  so.listen_host = listen_host_;
  so.checkpoint = cfg_.checkpoint();
  so.zero1 = cfg_.parallel().zero1();
  so.slot = env_.slot;
  so.connect = connect_;
  so.joining = env_.restarted;
  snapshots_ = std::make_unique<SnapshotSet>(so);
  snapshots_->open(o_.rank, members_.topo(), state_.get(), *store_, env_.epoch, injector_.get());
  if (injector_ && env_.slot >= 0) {
    injector_->set_slot_actions(slot_fault_actions(
        env_.job, [this] { return members_.ranks_on_slot(env_.slot); }, env_.ifname,
        [this]() -> std::optional<state::Leader> {
          return leader_link_ ? leader_link_->leader() : std::nullopt;
        }));
    // A defective unit is the machine's: a replay worker there computes as wrong.
    injector_->set_machine(env_.slot);
  }
  snapshots_->open_checkpointer(o_.rank, checkpoint_layout());

  make_parts(plan);
  return rb;
}

// The parts that hook into the step loop: the SDC checks, the update watcher and its
// probation, and rank 0's record of the job.
void Worker::make_parts(const FaultPlan& plan) {
  const bool sdc_hook = FaultInjector::has_sdc(plan.schedule);
  // The golden mini-GPT on one thread (a golden digest is reproducible), through this rank's
  // unit and its injected defect, made the first time replicas tie. Keel's GPT, not the job's
  // plugin: the repo's digests are the GPT's, and the tie-break judges machines.
  auto golden_backend = std::make_shared<std::unique_ptr<Backend>>();
  sdc_ = std::make_unique<SdcChecker>(
      cfg_.sdc().check_every_steps(), cfg_.parallel().zero1(), sdc_hook,
      [this, golden_backend, sdc_hook] {
        if (!*golden_backend)
          *golden_backend = backend_->kind() == DeviceKind::kCpu
                                ? make_cpu_backend(1)
                                : make_rank_backend(cfg_, o_.rank, o_.local_world_size);
        TrainerHooks hooks;
        if (injector_ && sdc_hook)
          hooks.computed = [this](int64_t st, TensorClass cls, float* d, size_t n, bool re) {
            injector_->on_computed(st, cls, d, n, re);
          };
        return golden_check(**golden_backend, hooks, std::nullopt, config_precision(cfg_));
      });
  probation_ =
      std::make_unique<Probation>(cfg_.update().probation_steps(), cfg_.update().max_loss_jump());
  updates_ = std::make_unique<UpdateWatcher>(connect_, o_.rank, update_check());
  record_ = std::make_unique<JobRecord>(env_.supervised, env_.job_start);
}

void Worker::connect_store() {
  // A rank under a controller (keel-launch, keel-worker --nproc) meets it through the job's
  // store whatever the world size: the controller writes the epoch's rebuild there, and a
  // one-rank job waited for ever on a store of its own.
  if (o_.world_size > 1 || env_.supervised) {
    const StoreAddress at = store_at(o_.store_addr);
    connect_ = at.connect;
    step_store_ = at.connect_step_path();
    // Peers on other machines reach this rank at its machine's address (KEEL_IFNAME's, or
    // the route toward the store), never loopback.
    listen_host_ = reachable_address(at.toward_host);
  } else {
    auto shared = std::make_shared<HashStore>();
    connect_ = [shared] { return shared; };
  }
  store_ = connect_();
  if (!step_store_) step_store_ = store_;
}

// A warm standby (keel-launch --standby) has loaded everything that does not depend on a
// rank; it checks itself and waits here until the controller hands it one. Then it joins
// that rank's epoch like a restarted rank, in the layout the promotion names.
std::optional<membership::Rebuild> Worker::park_as_standby() {
  // A machine found computing wrong keeps its defect (an injected one included): its golden
  // check fails, and it stays out of the job.
  FaultInjector defect(faults::FaultSchedule{}, -1, store_);
  TrainerHooks golden_hooks;
  if (env_.slot >= 0 && defect.arm_machine_defects(env_.slot))
    golden_hooks.computed = [&defect](int64_t s, TensorClass c, float* d, size_t n, bool r) {
      defect.on_computed(s, c, d, n, r);
    };
  const StandbyAssignment a =
      keel::park_as_standby(*backend_, config_precision(cfg_), connect_,
                            standby_identity(listen_host_.empty() ? "127.0.0.1" : listen_host_),
                            golden_hooks, [this] { rehearse_rank_memory(); });
  o_.rank = a.rank;
  env_.epoch = a.epoch;
  env_.restarted = true;
  apply_membership(a.membership);
  std::optional<membership::Rebuild> rb;
  if (recovery_) {
    recovery_->set_rank(a.rank);
    rb = recovery_->wait_rebuild(a.epoch);
    apply_membership(rb->membership());
  }
  o_.world_size = members_.topo().world_size();
  return rb;
}

void Worker::rehearse_rank_memory() {
  // Rank 0's state and Trainer in the configured layout, made and dropped with the backend
  // keeping the freed blocks: the rank this standby becomes (any rank of a DP-only job, any of
  // the same stage otherwise) then gets memory already faulted in. load_epoch() lets what is
  // left go once the real Trainer stands. Groups of one rank: the Trainer only binds them.
  if (!backend_->keep_freed_blocks(true)) return;  // a device's allocator: nothing to gain
  ProcessGroupOptions go;
  go.timeout = comm_timeout();
  ProcessGroups solo = make_process_groups(Topology(1, 1, 1), 0, std::make_shared<HashStore>(), go);
  const Topology& topo = members_.topo();
  auto state = make_train_state(cfg_, backend_.get(), *plugin_, topo, 0);
  Trainer rehearsal(cfg_, backend_.get(), plugin_, topo, 0, state.get(), &solo, data_.get());
}

void Worker::measure_peak() {
  // Measured (or read from cache) before any rank computes, so it sees an idle machine.
  if (!leader_) return;
  const bool cuda = cfg_.runtime().device() == config::RuntimeConfig::cuda;
  const int threads = rank_threads(cfg_, o_.local_world_size);
  const int machine_threads =
      cuda ? 1
           : std::min<int>(threads * o_.local_world_size, int(std::thread::hardware_concurrency()));
  Peak peak = device_peak(*backend_, config_precision(cfg_), machine_threads);
  if (cuda) peak.flops_per_s *= o_.world_size;  // one card per rank
  if (cuda) peak.theoretical_flops_per_s *= o_.world_size;
  mfu_ = MfuGauge(peak);
  // The GEMM path and both peaks, first of the job's lines: a slow path shows here.
  if (!cuda && !o_.quiet && !env_.restarted && env_.epoch == 0) {
    const BlasPath blas = blas_path();
    std::printf(
        "keel: cpu %s, %s; BLAS %s, core %s (chosen by %s%s%s); peak %.0f GFLOP/s %s, "
        "theoretical %.0f GFLOP/s (%s)\n",
        cpu_features().describe().c_str(), cpu_features().isa().c_str(), blas.config.c_str(),
        blas.core.c_str(), blas.chosen_by.c_str(), blas.best.empty() ? "" : "; best ",
        blas.best.c_str(), peak.flops_per_s / 1e9, peak.source.c_str(),
        peak.theoretical_flops_per_s / 1e9, peak.theoretical_source.c_str());
    std::fflush(stdout);
  }
}

void Worker::attach_supervision(const FaultPlan& plan) {
  // Under a supervisor faults may also arrive while the job runs (keel-ctl inject).
  if (!plan.schedule.fault().empty() || env_.supervised)
    injector_ = std::make_unique<FaultInjector>(plan.schedule, o_.rank, connect_());
  if (injector_) injector_->set_poll_store(step_store_);
  if (!env_.controller.empty()) {
    reporter_ = std::make_unique<ProgressReporter>(env_.controller, o_.rank, env_.slot,
                                                   std::make_shared<CommActivity>());
    reporter_->set_epoch(env_.epoch);
  }
  // With etcd a new leader may take over: the reports follow it (the first call names the
  // leader of now, which may already not be the one that started this rank).
  if (!env_.etcd.empty() && env_.supervised)
    leader_link_ =
        std::make_unique<LeaderLink>(env_.etcd, env_.job, [this](const state::Leader& l) {
          if (reporter_ && !l.endpoint().empty()) reporter_->set_endpoint(l.endpoint());
        });
}

void Worker::apply_membership(const membership::Membership& m) {
  members_.apply(m, &cfg_);
  witness_rank_ = record_witness(m);
}

SdcRank Worker::sdc_rank() {
  SdcRank r;
  r.trainer = trainer_.get();
  r.state = state_.get();
  r.world = epochs_.groups().get() ? groups().world.get() : nullptr;
  r.topo = &members_.topo();
  r.rank = o_.rank;
  r.epoch = epoch();
  r.leader = leader_;
  r.quiet = o_.quiet;
  r.store = step_store_.get();  // the SDC records are on the step's path
  r.region = snapshots_->region();
  r.snapshotter = snapshots_->snapshotter();
  r.reporter = reporter_.get();
  return r;
}

bool Worker::on_error(int64_t s, const std::exception& e) {
  const auto* nf = dynamic_cast<const NonFiniteStep*>(&e);
  // New code on probation that makes the loss non-finite is rolled back, not retried: every
  // rank sees the same global loss, so every rank fails alike, through the recovery below.
  const bool rollback = nf && recovery_ && probation_->on(s);
  if (rollback) {
    store::UpdateFailure f;
    f.set_why(nf->what());
    set_message(*store_, keys::update_failure_key(epoch()), f);
  }
  if (nf && !rollback) {
    // Every rank sees the same global numbers, so every rank retries, or stops, alike.
    if (!record_->retry_nonfinite(s, leader_, nf->what()))
      throw FatalStop(detail::concat(nf->what(),
                                     "; the retry was not finite either: stopping "
                                     "(lower optim.lr or check the data)"),
                      recovery::kExitNonFinite);
    if (leader_) LOG(WARNING) << nf->what() << "; retrying the step once";
    return true;
  }
  // A broken communicator, a corruption found or new code that failed its probation: the
  // epoch ends on every rank, and the recovery protocol starts the next one.
  if ((!ends_epoch(e) && !rollback) || !recovery_) return false;
  epochs_.fail(s, e.what(), [&] {
    if (snapshots_->snapshotter()) snapshots_->snapshotter()->wait_idle();
    // The steps' records so far, before the controller decides (a stop reports them).
    if (leader_) record_->flush(*step_store_);
    // Rank 0 may be what failed: the witness writes what its batches did not bring.
    if (o_.rank == witness_rank_) witness_.write_missing(*step_store_);
    if (!o_.quiet)
      LOG(WARNING) << "rank " << o_.rank << ": step " << s + 1 << ": " << e.what()
                   << "; waiting for the supervisor";
  });
  return true;
}

void Worker::after_step(const StepStats& step_stats) {
  // A check's recomputation ran before the step, outside the Trainer's clock: it is the
  // step's time all the same (tokens/s and MFU must show what the checks cost).
  StepStats st = step_stats;
  st.wall_s += sdc_->take_before_step_seconds();
  update_after_step(st);
  st.compute_s = std::max(0.0, st.wall_s - st.bubble_s - st.comm_s);
  const int64_t s = st.step, steps = cfg_.train().steps();
  if (snapshots_->snapshotter()) snapshots_->snapshotter()->capture();
  sdc_->step_done(st.wall_s);
  const std::optional<control::RoundStats> round =
      round_meter_.end_step(s + 1, st, groups(), members_.topo(), o_.rank);
  if (reporter_) {
    if (round) reporter_->set_round(*round);
    reporter_->step_done(s + 1, st.loss, st.wall_s, st.compute_s, st.comm_s);
  }
  const int every = cfg_.checkpoint().persistent_every_steps();
  if (snapshots_->checkpointer() && (s + 1) % every == 0)
    snapshots_->checkpointer()->save_async(*state_);
  if (leader_) record_->step(*step_store_, st, trainer_->model_flops_per_token(), mfu_.peak());
  if (o_.rank == witness_rank_) witness_.step(*step_store_, JobRecord::record_of(st, epoch()));
  if (leader_ && !o_.quiet &&
      ((s + 1) % std::max(1, cfg_.train().log_every()) == 0 || s + 1 == steps))
    print_step(st, double(st.tokens) / st.wall_s);
  const int eval_every = cfg_.train().eval_every();
  if (val_ && ((s + 1) % eval_every == 0 || s + 1 == steps)) {
    const double vl = trainer_->evaluate(*val_, cfg_.train().eval_batches());
    if (leader_) {
      JobRecord::eval(*store_, s + 1, vl);
      if (!o_.quiet) {
        std::printf("eval %5lld/%lld | val loss %.6f (%d batches)\n", static_cast<long long>(s + 1),
                    static_cast<long long>(steps), vl, cfg_.train().eval_batches());
        std::fflush(stdout);
      }
    }
  }
  settle_checkpoint();
}

void Worker::print_step(const StepStats& st, double tok_s) {
  const Mfu m = mfu(tok_s);
  char mfu_text[16] = "  n/a";
  if (m.valid) std::snprintf(mfu_text, sizeof(mfu_text), "%5.1f%%", 100 * m.value);
  // When the newest SDC check ran and passed (its verified step), so a reader sees the
  // checks keep up.
  char sdc_text[32] = "";
  if (sdc_->every() > 0 && sdc_->last_passed() > 0)
    std::snprintf(sdc_text, sizeof(sdc_text), " | sdc ok @%lld",
                  static_cast<long long>(sdc_->last_passed() + 1));
  std::printf(
      "step %5lld/%lld | loss %.6f | lr %.3e | norm %.4f | %8.0f tok/s | MFU %s | "
      "compute %3.0f%% comm %3.0f%% bubble %3.0f%%%s\n",
      static_cast<long long>(st.step + 1), static_cast<long long>(cfg_.train().steps()), st.loss,
      st.lr, st.grad_norm, tok_s, mfu_text, 100 * st.compute_s / st.wall_s,
      100 * st.comm_s / st.wall_s, 100 * st.bubble_s / st.wall_s, sdc_text);
  std::fflush(stdout);
}

// checkpoint.on_write_error: stop. A save fails on one rank or on all of them, at times that
// differ by rank, but every rank must stop after the same step (SnapshotSet::settle). A
// failure stops the step loop after this step.
void Worker::settle_checkpoint() {
  Communicator* world = members_.topo().world_size() > 1 ? groups().world.get() : nullptr;
  if (snapshots_->settle(world) && state_->step() < cfg_.train().steps())
    throw CheckpointWriteStop(detail::concat(
        "a persistent checkpoint could not be written: stopping after step ", state_->step(),
        " of ", cfg_.train().steps(), " (checkpoint.on_write_error: stop)"));
}

}  // namespace worker_detail

using worker_detail::FatalStop;
using worker_detail::Worker;

int run_worker(const WorkerOptions& o) {
  try {
    Worker w(o);
    return w.run();
  } catch (const FatalStop& e) {
    LOG(ERROR) << "rank " << o.rank << ": " << e.what();
    return e.code();
  }
}

}  // namespace keel
