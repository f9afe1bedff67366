// One rank's process (launcher/worker/worker.h), shared by worker.cc (setup, epochs, the step
// loop's hooks, the report) and worker_state.cc (loading, restoring, re-laying and
// snapshotting the TrainState). Private to launcher/.
#pragma once

#include "launcher/worker/worker.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include "ckpt/backup_placement.h"
#include "ckpt/backup_service.h"
#include "ckpt/persistent_checkpoint.h"
#include "ckpt/restore.h"
#include "ckpt/snapshot_region.h"
#include "ckpt/snapshotter.h"
#include "launcher/worker/fault_actions.h"
#include "launcher/worker/input_checks.h"
#include "launcher/worker/job_history.h"
#include "launcher/worker/mfu.h"
#include "launcher/worker/progress_reporter.h"
#include "launcher/worker/rank_backend.h"
#include "launcher/worker/recovery_client.h"
#include "launcher/recovery_protocol.h"
#include "launcher/worker/round_meter.h"
#include "launcher/worker/run_report.h"
#include "launcher/worker/standby.h"
#include "launcher/worker/step_loop.h"
#include "launcher/job_env.h"
#include "model/data_loader.h"
#include "model/job_layout.h"
#include "model/llmc_checkpoint.h"
#include "model/plugin_loader.h"
#include "model/trainer.h"
#include "parallel/hash_store.h"
#include "parallel/net_address.h"
#include "parallel/process_groups.h"
#include "parallel/tcp_store.h"
#include "parallel/traced_communicator.h"
#include "proto/config_loader.h"
#include "robust/fault_injector.h"
#include "robust/fault_spec.h"
#include "robust/sdc_check.h"
#include "runtime/cpu/blas_core.h"
#include "runtime/cpu/cpu_features.h"

namespace keel::worker_detail {

using Clock = std::chrono::steady_clock;
using recovery::unix_now;

// What the controller tells a rank at its start (launcher/job_env.h), with a lone rank's
// defaults filled in: a rank started alone is its own job and its own lineage.
struct RankEnv {
  std::string job;
  bool supervised = false;
  int epoch = 0;
  bool restarted = false;
  double job_start = 0;
  std::string resume_latest;
  std::string lineage;

  static RankEnv read() {
    const JobEnv& j = JobEnv::get();
    RankEnv e;
    e.job = j.job.empty() ? make_job_id() : j.job;  // its own job: removed at its end
    e.supervised = j.supervised;
    e.epoch = j.epoch;
    e.restarted = j.restarted;
    e.job_start = j.job_start > 0 ? j.job_start : unix_now();
    e.resume_latest = j.resume_latest;
    e.lineage = j.lineage.value_or(e.job);
    return e;
  }
};

inline std::string layout_name(const Topology& t) {
  return detail::concat("tp", t.tp(), " pp", t.pp(), " dp", t.dp());
}

inline std::string time_str(double t) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6f", t);
  return buf;
}

// A plugin on probation broke the training (a loss jump): the recovery rolls it back. A
// CommError, so that the step loop's failure path (abort, ack, rebuild) carries it.
class UpdateProbationFailed : public CommError {
 public:
  explicit UpdateProbationFailed(const std::string& what) : CommError(what) {}
};

// Exits the process with a code the supervisor does not answer with a restart.
class FatalStop : public Error {
 public:
  FatalStop(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

class Worker {
 public:
  explicit Worker(const WorkerOptions& o) : o_(o), env_(RankEnv::read()) {}
  // A rank without a supervisor owns its job's shared memory: removed however it ends
  // (short of SIGKILL; a later supervisor removes that of a dead PID).
  ~Worker() {
    stop_update_watch();
    if (snapshotter_) snapshotter_->stop();
    if (!env_.supervised) {
      region_.reset();
      unlink_job_segments(env_.job);
    }
  }

  int run();

 private:
  void setup();

  // The rank's snapshot region, the backup server for the rank it holds a backup of, and the
  // snapshotter, under the rank's id (again after the id changed).
  void open_snapshots();

  void open_checkpointer();

  // The job's data parallelism shrank or grew: this surviving rank becomes `rank` of a layout
  // with `dp` replicas. Its state is the same (replicas are equal without ZeRO-1), laid out
  // again (the flat buffers are padded to a multiple of dp); its snapshot names move to the
  // new id after the next rendezvous, when every rank has let go of its old ones.
  void relayout(int rank, int dp, const membership::Rebuild& rb);

  void register_pid();

  CheckpointLayout checkpoint_layout() const {
    CheckpointLayout l;
    l.tp = topo_.tp();
    l.pp = topo_.pp();
    l.dp = topo_.dp();
    l.zero1 = cfg_.parallel().zero1();
    l.plugin_name = plugin_->name();
    l.plugin_version = plugin_->version();
    l.lineage = env_.lineage;
    l.model = describe_model(cfg_);
    return l;
  }

  int worker_threads() const { return rank_threads(cfg_, o_.local_world_size); }

  // The state the job starts from: --resume (or, after restart_all, the newest checkpoint),
  // model.init_checkpoint, or a fresh init.
  void load_start_state();

  // The step the job's report starts at: where its first process started (a --resume
  // point or 0), kept once for the whole job.
  void record_start_step();

  void start_state();

  // Joins `epoch`: builds its communicators (a rendezvous the supervisor can abort), the
  // Trainer the first time or rebinds it, and loads step S (-2: the job's start state, -1:
  // the start state after a failure, else a snapshot). If the epoch fails while it is being
  // built (a peer died in the rendezvous), the supervisor starts the next one: go on there.
  void build_epoch(int epoch, const membership::Rebuild* rb);

  // A grown replica's ranks get the state (and its step) from their DP group's first rank,
  // which every survivor of the group holds equally.
  void receive_state_from_replica();

  void make_trainer();

  ProcessGroups make_groups(int epoch);

  std::string holder_address();

  // Loads the controller's restore step into the state, from where the Rebuild says (the
  // persistent checkpoint, the start state) or else from the rank's own copies: its live
  // state, its snapshot, its backup holder's. Records the source for the incident.
  void restore(const membership::Rebuild& rb);

  bool on_error(int64_t s, const std::exception& e);

  // Survivor: new communicators for `epoch`, the same state, plugin and memory.
  void after_step(const StepStats& st);

  // Rank 0 keeps each step's numbers in the job's store, so they survive its own restart.
  void record_step(const StepStats& st);

  void finish();
  void fill_report(RunReport* rep);

  // Hot updates of the plugin (worker_update.cc; the controller's part is
  // controller_update.cc). A thread checks each plan against the state and waits for the
  // step to switch at; the step loop switches.
  void update_watch();
  void stop_update_watch();
  void update_before_step(int64_t s);
  // On probation after an update: a loss jump fails every rank (UpdateProbationFailed).
  void update_after_step(const StepStats& st);
  bool on_probation(int64_t step) const;  // new code on probation at this step
  // This process runs `path` (build `hash`) from now on, unless it already does.
  void adopt_plugin(const std::string& path, const std::string& hash);
  // A process started after an update runs the job's current plugin.
  void adopt_current_plugin();

  // Silent data corruption checks (worker_sdc.cc; the decisions are robust/sdc_check.h's).
  // At a check step: before it, this replica recomputes another's first micro-batch; before
  // its update (the state still the step's start), every rank's digests are gathered and
  // judged, third opinions asked for, and either the state is kept as verified or every rank
  // throws SdcFound with the verdict in the store.
  void sdc_before_step(int64_t s);
  void sdc_before_update(int64_t s);
  // The job's start state is its first verified one.
  void sdc_start();
  // One line: what the checks compare on this layout and what they cannot see.
  std::string sdc_coverage() const;
  // The verdict left for the controller; then SdcFound.
  [[noreturn]] void sdc_found(int64_t s, const sdc::Verdict& v);
  // Injected sdc faults no check caught, and why (the report's sdc_missed).
  std::vector<std::string> sdc_missed(const RunReport& rep) const;

  WorkerOptions o_;
  RankEnv env_;
  config::JobConfig cfg_;
  Topology topo_{1, 1, 1};
  bool leader_ = false;
  int epoch_ = 0;
  Peak peak_;
  bool mfu_refused_ = false;  // the stale peak was named (and its cache dropped) once
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<Plugin> plugin_;
  std::unique_ptr<DataLoader> data_, val_;
  std::function<std::shared_ptr<Store>()> connect_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<TrainState> state_;
  std::unique_ptr<ProcessGroups> groups_;
  std::mutex groups_mu_;  // the recovery watcher aborts groups_ from its thread
  std::atomic<bool> rendezvous_cancel_{false};
  bool relaid_out_ = false;  // the rank's id changed: snapshots reopen after the rendezvous
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<FaultInjector> injector_;
  std::unique_ptr<RecoveryClient> recovery_;
  std::shared_ptr<CommActivity> activity_;
  std::unique_ptr<ProgressReporter> reporter_;
  RoundMeter round_meter_{0};  // sized in setup() from detect.slow_round_steps
  std::unique_ptr<SnapshotRegion> region_;
  std::unique_ptr<BackupServer> backup_server_;
  std::string listen_host_ = "127.0.0.1";  // where this rank's sockets listen
  std::unique_ptr<Snapshotter> snapshotter_;
  std::unique_ptr<PersistentCheckpointer> checkpointer_;
  // checkpoint.on_write_error: stop: a save failed on some rank, and every rank stops after
  // the same step (settle_checkpoint in worker.cc).
  bool checkpoint_stop_ = false;
  void settle_checkpoint();
  int exit_code_ = 0;  // once the job is done: kExitWriteFailed if a file could not be written
  int holder_ = -1;
  bool replica_holder_ = false;  // holder_ is a DP replica: its own snapshot is the backup
  int64_t nonfinite_retried_ = -1;
  report::Incident nan_incident_;
  bool first_step_in_epoch_ = true;
  double live_step_s_ = 0;        // rank 0: time in steps so far (for keel-ctl status)
  double live_published_at_ = 0;  // when it last published them (unix seconds)
  int sdc_every_ = 0;             // sdc.check_every_steps
  bool sdc_injected_ = false;     // the fault plan holds an sdc fault (the computed hook)
  bool sdc_armed_ = false;        // this step is a check step and its recompute is done
  MicroBatchDigest sdc_recomputed_;
  int64_t sdc_last_passed_ = -1;  // the step of the newest check this rank saw pass
  double sdc_seconds_ = 0;        // this rank's time in checks
  double steps_wall_s_ = 0;       // this rank's time in steps (for the checks' share)
  double sdc_before_step_s_ = 0;  // this step's recomputation, before the Trainer's clock
  std::unique_ptr<Backend> golden_backend_;  // one thread: a golden digest is reproducible
  std::thread update_thread_;
  std::atomic<bool> update_stop_{false};
  std::mutex update_mu_;
  std::shared_ptr<Plugin> update_next_;    // checked, waiting for its step (update_mu_)
  int64_t update_id_ = -1;                 // (update_mu_)
  std::atomic<int64_t> update_step_{-1};   // switch before this step
  int64_t probation_from_ = -1;            // the step new code took over at (-1: none)
  std::optional<double> probation_limit_;  // the loss the new code may show on probation
  std::deque<double> recent_losses_;       // the newest 10 global losses
};

}  // namespace keel::worker_detail
