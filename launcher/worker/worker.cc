#include "launcher/worker/worker.h"

#include "launcher/worker/worker_impl.h"
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

int Worker::run() {
  setup();
  start_state();
  StepHooks hooks;
  // First: the step's time for fail-slow detection covers every hook after it.
  hooks.before_step.push_back([this](int64_t) { round_meter_.begin_step(); });
  hooks.before_step.push_back([this](int64_t s) {
    if (injector_) injector_->before_step(s);
  });
  hooks.before_step.push_back([this](int64_t s) { update_before_step(s); });
  hooks.before_step.push_back([this](int64_t s) { sdc_before_step(s); });
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

void Worker::setup() {
  cfg_ = load_config(o_.config_path, o_.overrides);
  // Faults name ranks of the job as configured, also after its data parallelism changed.
  const int configured_world = cfg_.parallel().tp() * cfg_.parallel().pp() * cfg_.parallel().dp();
  // A rank started after the job's data parallelism shrank or grew (launcher/controller/controller.cc).
  if (const char* dp = std::getenv("KEEL_DP")) cfg_.mutable_parallel()->set_dp(std::atoi(dp));
  check_job_inputs(o_, cfg_);
  topo_ = Topology(cfg_.parallel().tp(), cfg_.parallel().pp(), cfg_.parallel().dp());
  if (topo_.world_size() != o_.world_size)
    throw InputError(detail::concat(o_.config_path, ": parallel.tp·pp·dp = ", topo_.world_size(),
                                    " (", layout_name(topo_), ") but the job has ", o_.world_size,
                                    " rank(s); start it with --nproc ", topo_.world_size()));
  FaultPlan plan;
  for (const auto& f : o_.faults) add_fault_flag(&plan, f);
  if (!o_.inject_path.empty()) add_fault_file(&plan, o_.inject_path);
  validate_fault_plan(plan, configured_world, cfg_.train().steps());
  sdc_injected_ = FaultInjector::has_sdc(plan.schedule);
  sdc_every_ = cfg_.sdc().check_every_steps();
  round_meter_ = RoundMeter(cfg_.detect().slow_round_steps());
  for (const auto& f : plan.schedule.fault())
    if ((f.kind() == faults::Fault::slot_loss || f.kind() == faults::Fault::partition) &&
        !std::getenv("KEEL_SLOT"))
      throw InputError(fault_kind_name(f.kind()) +
                       " faults need slots (machines): start the job with keel-launch");
  const int threads = worker_threads();
  const bool cuda = cfg_.runtime().device() == config::RuntimeConfig::cuda;
  const Precision precision = config_precision(cfg_);
  backend_ = make_rank_backend(cfg_, o_.rank, o_.local_world_size);
  plugin_ = Plugin::load(cfg_.model().plugin());
  data_ = std::make_unique<DataLoader>(DataLoader::from_config(cfg_));
  if (cfg_.train().eval_every() > 0)
    val_ = std::make_unique<DataLoader>(DataLoader::from_config(cfg_, /*val=*/true));

  if (o_.world_size > 1) {
    auto [host, port] = parse_host_port(o_.store_addr);
    connect_ = [host = host, port = port] { return std::make_shared<TcpStore>(host, port); };
    // Peers on other machines reach this rank at its machine's address (KEEL_IFNAME's, or
    // the route toward the store), never loopback.
    listen_host_ = reachable_address(host);
  } else {
    auto shared = std::make_shared<HashStore>();
    connect_ = [shared] { return shared; };
  }
  store_ = connect_();
  // A warm standby (keel-launch --standby) has loaded everything that does not depend on
  // a rank; it checks itself and waits here until the controller hands it one.
  if (std::getenv("KEEL_STANDBY")) {
    // A machine found computing wrong keeps its defect (an injected one included): its
    // golden check fails, and it stays out of the job.
    FaultInjector defect(faults::FaultSchedule{}, -1, store_);
    TrainerHooks golden_hooks;
    if (const char* slot = std::getenv("KEEL_SLOT");
        slot && defect.arm_machine_defects(std::atoi(slot)))
      golden_hooks.computed = [&defect](int64_t s, TensorClass c, float* d, size_t n, bool r) {
        defect.on_computed(s, c, d, n, r);
      };
    const StandbyAssignment a = park_as_standby(
        *backend_, plugin_, precision, connect_,
        standby_identity(listen_host_.empty() ? "127.0.0.1" : listen_host_), golden_hooks);
    o_.rank = a.rank;
    env_.epoch = a.epoch;
    env_.restarted = true;
    if (a.world != o_.world_size) {  // the data parallelism changed since it parked
      o_.world_size = a.world;
      cfg_.mutable_parallel()->set_dp(a.world / (topo_.tp() * topo_.pp()));
      topo_ = Topology(cfg_.parallel().tp(), cfg_.parallel().pp(), cfg_.parallel().dp());
    }
  }
  leader_ = o_.rank == 0;
  epoch_ = env_.epoch;
  // Measured (or read from cache) before any rank computes, so it sees an idle machine.
  if (leader_) {
    int machine_threads = cuda ? 1
                               : std::min<int>(threads * o_.local_world_size,
                                               int(std::thread::hardware_concurrency()));
    peak_ = device_peak(*backend_, precision, machine_threads);
    if (cuda) peak_.flops_per_s *= o_.world_size;  // one card per rank
    if (cuda) peak_.theoretical_flops_per_s *= o_.world_size;
    // The GEMM path and both peaks, first of the job's lines: a slow path shows here.
    if (!cuda && !o_.quiet && !env_.restarted && epoch_ == 0) {
      const BlasPath blas = blas_path();
      std::printf(
          "keel: cpu %s, %s; BLAS %s, core %s (chosen by %s%s%s); peak %.0f GFLOP/s %s, "
          "theoretical %.0f GFLOP/s (%s)\n",
          cpu_features().describe().c_str(), cpu_features().isa().c_str(), blas.config.c_str(),
          blas.core.c_str(), blas.chosen_by.c_str(), blas.best.empty() ? "" : "; best ",
          blas.best.c_str(), peak_.flops_per_s / 1e9, peak_.source.c_str(),
          peak_.theoretical_flops_per_s / 1e9, peak_.theoretical_source.c_str());
      std::fflush(stdout);
    }
  }
  // Under a supervisor faults may also arrive while the job runs (keel-ctl inject).
  if (!plan.schedule.fault().empty() || env_.supervised)
    injector_ = std::make_unique<FaultInjector>(plan.schedule, o_.rank, connect_());
  if (env_.supervised) recovery_ = std::make_unique<RecoveryClient>(connect_, o_.rank);
  if (const char* ep = std::getenv("KEEL_CONTROLLER"); ep && *ep) {
    activity_ = std::make_shared<CommActivity>();
    const char* slot = std::getenv("KEEL_SLOT");
    reporter_ =
        std::make_unique<ProgressReporter>(ep, o_.rank, slot ? std::atoi(slot) : -1, activity_);
    reporter_->set_epoch(epoch_);
  }
  register_pid();

  state_ = make_train_state(cfg_, backend_.get(), *plugin_, topo_, o_.rank);
  // A rank started alone owns its shared memory: Ctrl-C, a kill or an exit fault, which skip
  // ~Worker, must not leave it behind.
  if (!env_.supervised) own_segments_until_exit(env_.job, o_.rank);
  open_snapshots();
  if (injector_ && std::getenv("KEEL_SLOT")) {
    injector_->set_slot_actions(slot_fault_actions(env_.job));
    // A defective unit is the machine's: a replay worker there computes as wrong.
    injector_->set_machine(std::atoi(std::getenv("KEEL_SLOT")));
  }
  open_checkpointer();
}

void Worker::start_state() {
  // A restarted rank (or a promoted standby) joins the epoch the supervisor started for
  // it, at the step everyone restores; -2 means the job's start state.
  if (env_.restarted) {
    adopt_current_plugin();
    const membership::Rebuild rb = recovery_->wait_rebuild(epoch_);
    build_epoch(epoch_, &rb);
  } else {
    build_epoch(epoch_, nullptr);
  }
  update_watch();
  if (leader_ && !o_.quiet && !env_.restarted && epoch_ == 0)
    std::printf(
        "keel: %s %s, %lld params, %s on %d rank(s), %d micro-batch(es) of %d per step, "
        "backend %s\n",
        plugin_->name().c_str(), plugin_->version().c_str(),
        static_cast<long long>(trainer_->global_param_count()), layout_name(topo_).c_str(),
        topo_.world_size(), trainer_->micro_batches(), cfg_.train().micro_batch_size(),
        backend_->name().c_str());
}

// Joins `epoch`: builds its communicators (a rendezvous the supervisor can abort), the
// Trainer the first time or rebinds it, and loads the controller's restore step (`rb` null:
// the job's start state). If the epoch fails while it is being built (a peer died in the
// rendezvous), the controller starts the next one: go on there.
void Worker::build_epoch(int epoch, const membership::Rebuild* first) {
  std::optional<membership::Rebuild> rb;
  if (first) rb = *first;
  while (true) {
    epoch_ = epoch;
    rendezvous_cancel_ = false;
    // A survivor (it has a Trainer from the epoch before) whose id the controller changed.
    bool grow = false;
    if (recovery_ && trainer_ && rb && !rb->renumber().empty()) {
      auto n = rb->renumber().find(o_.rank);
      KEEL_CHECK(n != rb->renumber().end(), "rank ", o_.rank, " is retired in epoch ", epoch_,
                 " but still running");
      relayout(n->second, rb->membership().dp(), *rb);
    }
    // Growing back: every rank of the epoch takes part in its replica's broadcast.
    if (rb) grow = rb->new_ranks_size() > 0;
    // The epoch's plugin (a lazy update applied with it, or a rollback of a failed one).
    if (rb) adopt_plugin(rb->plugin_path(), rb->plugin_hash());
    if (backup_server_)
      store_->set(keys::backup_addr_key(epoch_, o_.rank), backup_server_->address());
    if (recovery_)
      recovery_->watch(epoch_, [this] {
        rendezvous_cancel_ = true;
        std::lock_guard<std::mutex> l(groups_mu_);
        if (groups_) groups_->abort_all();
      });
    try {
      auto groups = std::make_unique<ProcessGroups>(make_groups(epoch_));
      if (injector_) injector_->wrap(*groups, activity_);
      {
        std::lock_guard<std::mutex> l(groups_mu_);
        if (trainer_) trainer_->rebind(groups.get());
        groups_ = std::move(groups);
      }
      if (relaid_out_) {
        // Every rank has passed its rendezvous, so every old name is let go: names of the
        // new ids left by retired ranks are stale.
        shm_unlink(snapshot_segment_name(env_.job, o_.rank).c_str());
        shm_unlink(backup_segment_name(env_.job, o_.rank).c_str());
        open_snapshots();
        open_checkpointer();
        relaid_out_ = false;
      }
      if (!trainer_) make_trainer();
      if (grow) receive_state_from_replica();
      round_meter_.new_epoch();
      if (reporter_) {
        reporter_->set_epoch(epoch_);
        reporter_->set_steps(state_->step());
      }
      // A replica holds the same state already: nothing to push.
      if (snapshotter_ && holder_ >= 0 && !replica_holder_)
        snapshotter_->set_backup_holder(holder_address());
      if (!rb) {
        load_start_state();
        record_start_step();
        sdc_start();
      } else if (!grow) {
        restore(*rb);
      }
      if (recovery_ && (rb || epoch_ > 0)) recovery_->mark_restored(epoch_);
      first_step_in_epoch_ = true;
      return;
    } catch (const CommError& e) {
      if (!recovery_) throw;
      LOG(WARNING) << "rank " << o_.rank << ": epoch " << epoch_
                   << " failed while starting: " << e.what();
      rb = recovery_->fail_and_wait(epoch_, state_->step(), state_->step(), e.what());
      epoch = epoch_ + 1;
    }
  }
}

void Worker::make_trainer() {
  trainer_ = std::make_unique<Trainer>(cfg_, backend_.get(), plugin_, topo_, o_.rank, state_.get(),
                                       groups_.get(), data_.get());
  TrainerHooks th;
  th.before_update = [this](int64_t s) {
    if (snapshotter_) snapshotter_->wait_idle();
    sdc_before_update(s);
  };
  if (injector_)
    th.local_metrics = [this](int64_t s, float* m) { injector_->on_local_metrics(s, m); };
  // Only a job with an sdc fault pays for the hook (it reads a step's first gradient before
  // any of it is reduced), and on every rank alike.
  if (injector_ && sdc_injected_)
    th.computed = [this](int64_t s, TensorClass cls, float* d, size_t n, bool re) {
      injector_->on_computed(s, cls, d, n, re);
    };
  trainer_->set_hooks(th);
}

ProcessGroups Worker::make_groups(int epoch) {
  ProcessGroupOptions g;
  g.epoch = epoch;
  g.timeout = Millis(cfg_.parallel().comm_timeout_ms());
  g.device = backend_->kind();
  g.cuda_device = o_.rank % std::max(1, o_.local_world_size);
  g.host = listen_host_;
  g.cancel = &rendezvous_cancel_;
  ProcessGroups groups = make_process_groups(topo_, o_.rank, store_, g);
  if (activity_) trace_communicators(groups, activity_);
  return groups;
}

std::string Worker::holder_address() {
  return store_->get(keys::backup_addr_key(epoch_, holder_),
                     Millis(cfg_.parallel().comm_timeout_ms()));
}

bool Worker::on_error(int64_t s, const std::exception& e) {
  const auto* nf = dynamic_cast<const NonFiniteStep*>(&e);
  // New code on probation that makes the loss non-finite is rolled back, not retried: every
  // rank sees the same global loss, so every rank fails alike, through the recovery below.
  const bool rollback = nf && recovery_ && on_probation(s);
  if (rollback) store_->set(keys::update_failure_key(epoch_), nf->what());
  if (nf && !rollback) {
    // Every rank sees the same global numbers, so every rank retries, or stops, alike.
    if (nonfinite_retried_ == s)
      throw FatalStop(detail::concat(nf->what(),
                                     "; the retry was not finite either: stopping "
                                     "(lower optim.lr or check the data)"),
                      recovery::kExitNonFinite);
    nonfinite_retried_ = s;
    if (leader_) {
      LOG(WARNING) << nf->what() << "; retrying the step once";
      nan_incident_.set_kind("nan");
      nan_incident_.set_rank(-1);
      nan_incident_.set_step(int(s));
      nan_incident_.set_detected_at(unix_now());
      nan_incident_.set_recovered_at(unix_now());
      nan_incident_.set_restored_step(int(s));
      nan_incident_.set_steps_lost(0);
      nan_incident_.set_action("update skipped; step retried");
      nan_incident_.set_detail(nf->what());
      nan_incident_.set_epoch(epoch_);
    }
    return true;
  }
  if ((!dynamic_cast<const CommError*>(&e) && !rollback) || !recovery_) return false;
  // Peers blocked on this rank must learn at once; then settle the snapshot in flight so
  // the supervisor reads stable slots, and wait for its decision.
  groups_->abort_all();
  if (snapshotter_) snapshotter_->wait_idle();
  if (!o_.quiet)
    LOG(WARNING) << "rank " << o_.rank << ": step " << s + 1 << ": " << e.what()
                 << "; waiting for the supervisor";
  const membership::Rebuild rb = recovery_->fail_and_wait(epoch_, state_->step(), s, e.what());
  recovery_->stop_watch();
  build_epoch(epoch_ + 1, &rb);
  return true;
}

// Survivor: new communicators for `epoch`, the same state, plugin and memory.
void Worker::after_step(const StepStats& step_stats) {
  // A check's recomputation ran before the step, outside the Trainer's clock: it is the
  // step's time all the same (tokens/s and MFU must show what the checks cost).
  StepStats st = step_stats;
  st.wall_s += std::exchange(sdc_before_step_s_, 0.0);
  update_after_step(st);
  st.compute_s = std::max(0.0, st.wall_s - st.bubble_s - st.comm_s);
  const int64_t s = st.step, steps = cfg_.train().steps();
  if (snapshotter_) snapshotter_->capture();
  steps_wall_s_ += st.wall_s;
  const std::optional<control::RoundStats> round =
      round_meter_.end_step(s + 1, st, *groups_, topo_, o_.rank);
  if (reporter_) {
    if (round) reporter_->set_round(*round);
    reporter_->step_done(s + 1, st.loss, st.wall_s, st.compute_s, st.comm_s);
  }
  const int every = cfg_.checkpoint().persistent_every_steps();
  if (checkpointer_ && (s + 1) % every == 0) checkpointer_->save_async(*state_);
  if (leader_) record_step(st);
  if (leader_ && !o_.quiet &&
      ((s + 1) % std::max(1, cfg_.train().log_every()) == 0 || s + 1 == steps)) {
    const double tok_s = double(st.tokens) / st.wall_s;
    const Mfu mfu = honest_mfu(trainer_->model_flops_per_token() * tok_s, peak_);
    char mfu_text[16] = "  n/a";
    if (mfu.valid) std::snprintf(mfu_text, sizeof(mfu_text), "%5.1f%%", 100 * mfu.value);
    if (!mfu.valid && peak_.flops_per_s > 0 && !mfu_refused_) {
      mfu_refused_ = true;  // once: name the stale peak and make the next start measure
      LOG(WARNING) << mfu.why_not << "; its cache is dropped";
      forget_peak(peak_);
    }
    // When the newest SDC check ran and passed (its verified step), so a reader sees the
    // checks keep up.
    char sdc_text[32] = "";
    if (sdc_every_ > 0 && sdc_last_passed_ > 0)
      std::snprintf(sdc_text, sizeof(sdc_text), " | sdc ok @%lld",
                    static_cast<long long>(sdc_last_passed_ + 1));
    std::printf(
        "step %5lld/%lld | loss %.6f | lr %.3e | norm %.4f | %8.0f tok/s | MFU %s | "
        "compute %3.0f%% comm %3.0f%% bubble %3.0f%%%s\n",
        static_cast<long long>(s + 1), static_cast<long long>(steps), st.loss, st.lr, st.grad_norm,
        tok_s, mfu_text, 100 * st.compute_s / st.wall_s, 100 * st.comm_s / st.wall_s,
        100 * st.bubble_s / st.wall_s, sdc_text);
    std::fflush(stdout);
  }
  const int eval_every = cfg_.train().eval_every();
  if (val_ && ((s + 1) % eval_every == 0 || s + 1 == steps)) {
    const double vl = trainer_->evaluate(*val_, cfg_.train().eval_batches());
    if (leader_) {
      char buf[40];
      std::snprintf(buf, sizeof(buf), "%.17g", vl);
      store_->set(keys::eval_key(s + 1), buf);
      if (!o_.quiet) {
        std::printf("eval %5lld/%lld | val loss %.6f (%d batches)\n", static_cast<long long>(s + 1),
                    static_cast<long long>(steps), vl, cfg_.train().eval_batches());
        std::fflush(stdout);
      }
    }
  }
  settle_checkpoint();
}

// checkpoint.on_write_error: stop. A save fails on one rank or on all of them, at times that
// differ by rank, but every rank must stop after the same step: each step the ranks take the
// worst outcome of their newest saves (failed > in flight > written), one float over the
// world group, only in this mode. A failure stops the step loop after this step.
void Worker::settle_checkpoint() {
  if (!checkpointer_ || cfg_.checkpoint().on_write_error() != config::CheckpointConfig::stop)
    return;
  using Outcome = PersistentCheckpointer::Outcome;
  const Outcome o = checkpointer_->last_outcome();
  float worst = o == Outcome::kFailed ? 2.f : o == Outcome::kInFlight ? 1.f : 0.f;
  if (topo_.world_size() > 1) groups_->world->all_reduce(&worst, 1, ReduceOp::kMax);
  if (worst < 2 || checkpoint_stop_) return;
  checkpoint_stop_ = true;
  if (state_->step() < cfg_.train().steps())
    throw CheckpointWriteStop(detail::concat(
        "a persistent checkpoint could not be written: stopping after step ", state_->step(),
        " of ", cfg_.train().steps(), " (checkpoint.on_write_error: stop)"));
}

// Rank 0 keeps each step's numbers in the job's store, so they survive its own restart.
void Worker::record_step(const StepStats& st) {
  report::StepRecord r;
  r.set_step(st.step);
  r.set_loss(st.loss);
  r.set_grad_norm(st.grad_norm);
  r.set_lr(st.lr);
  r.set_wall_s(st.wall_s);
  r.set_compute_s(st.compute_s);
  r.set_comm_s(st.comm_s);
  r.set_bubble_s(st.bubble_s);
  r.set_bytes_tp(double(st.bytes_tp));
  r.set_bytes_pp(double(st.bytes_pp));
  r.set_bytes_dp(double(st.bytes_dp));
  r.set_bytes_emb(double(st.bytes_emb));
  r.set_tokens(double(st.tokens));
  r.set_end_at(unix_now());
  store_->set(keys::step_key(st.step), r.SerializeAsString());
  store_->set("progress", std::to_string(st.step + 1));
  live_step_s_ += st.wall_s;
  // For keel-ctl status; twice a second is enough for a person, and each is a round trip
  // to the store on the step's path.
  if (env_.supervised && unix_now() - live_published_at_ >= 0.5) {
    live_published_at_ = unix_now();
    const double tok_s = double(st.tokens) / st.wall_s;
    store_->set("live/tokens_per_s", std::to_string(tok_s));
    store_->set("live/ettr",
                std::to_string(live_step_s_ / std::max(1e-9, unix_now() - env_.job_start)));
    store_->set("live/mfu",
                std::to_string(honest_mfu(trainer_->model_flops_per_token() * tok_s, peak_).value));
  }
  if (first_step_in_epoch_) {
    first_step_in_epoch_ = false;
    store_->set(keys::first_step_key(epoch_), time_str(unix_now()));
  }
  if (nan_incident_.step() == st.step && !nan_incident_.kind().empty()) {
    nan_incident_.set_first_step_at(unix_now());
    const int64_t n = store_->add(keys::kIncidentCount, 1) - 1;
    store_->set(keys::incident_key(n), nan_incident_.SerializeAsString());
    nan_incident_.Clear();
  }
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
