// One rank's process (launcher/worker/worker.h): the Worker composes the parts that do the
// work, each in a file of its own, and holds what they share (the config, the layout, the
// TrainState, the Trainer, the store):
//   applied_membership.h  the layout from the epoch's Rebuild, the worker's only copy of it
//   epoch_runner.h        joining an epoch and moving to the next when it fails
//   snapshot_set.h        snapshots, backups and persistent checkpoints
//   sdc_checker.h         silent data corruption checks
//   update_watcher.h      hot updates of the plugin, and their probation
//   job_record.h          rank 0's record of the job in the store
// Its methods: worker.cc (setup, the step loop's hooks), worker_epoch.cc (joining an epoch,
// restoring, re-laying out), worker_update.cc (switching plugins), worker_report.cc (the
// job's end and its report). Private to launcher/worker/.
#pragma once

#include "launcher/worker/worker.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ckpt/checkpoint_dir_lock.h"
#include "launcher/etcd/leader_link.h"
#include "launcher/job_env.h"
#include "launcher/recovery_protocol.h"
#include "launcher/run_report.h"
#include "launcher/worker/applied_membership.h"
#include "launcher/worker/epoch_runner.h"
#include "launcher/worker/job_record.h"
#include "launcher/worker/mfu.h"
#include "launcher/worker/progress_reporter.h"
#include "launcher/worker/recovery_client.h"
#include "launcher/worker/round_meter.h"
#include "launcher/worker/sdc_checker.h"
#include "launcher/worker/snapshot_set.h"
#include "launcher/worker/step_loop.h"
#include "launcher/worker/step_witness.h"
#include "launcher/worker/update_watcher.h"
#include "model/data_loader.h"
#include "model/plugin_loader.h"
#include "model/trainer.h"
#include "parallel/store.h"
#include "parallel/traced_communicator.h"
#include "proto/config.pb.h"
#include "proto/membership.pb.h"
#include "robust/fault_injector.h"
#include "robust/fault_spec.h"

namespace keel::worker_detail {

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
  int slot = -1;                  // the slot it runs on (-1: none)
  std::string controller;         // the control plane's endpoint ("" : none)
  std::vector<std::string> etcd;  // the job's etcd: the leader is followed there
  std::string ifname;             // the slot's own network interface ("" : none)
  bool standby = false;           // a parked standby until the controller promotes it

  static RankEnv read();
};

// A plugin on probation broke the training (a loss jump): the recovery rolls it back.
class UpdateProbationFailed : public RecoverableFailure {
 public:
  using RecoverableFailure::RecoverableFailure;
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
  explicit Worker(const WorkerOptions& o);
  // A rank without a supervisor owns its job's shared memory: removed however it ends
  // (short of SIGKILL; a later supervisor removes that of a dead PID).
  ~Worker();

  int run();

 private:
  // --- worker.cc: setup ---
  // Returns the Rebuild of the epoch the rank starts in (none without a controller).
  std::optional<membership::Rebuild> setup();
  // The job's store: a TcpStore per caller across processes, or one in-memory store.
  void connect_store();
  // A warm standby checks itself and waits for a rank (launcher/worker/standby.h); returns
  // the Rebuild of the epoch it joins (none without a controller).
  std::optional<membership::Rebuild> park_as_standby();
  void rehearse_rank_memory();
  // Rank 0 measures (or reads) the device's peak before any rank computes.
  void measure_peak();
  // The fault injector and the progress reporter.
  void attach_supervision(const FaultPlan& plan);
  // The SDC checker, the update watcher and its probation, the job record.
  void make_parts(const FaultPlan& plan);
  // Takes `m` as the job's layout from now on (the one place that changes it).
  void apply_membership(const membership::Membership& m);
  // The objects a step check works with, now.
  SdcRank sdc_rank();

  // --- worker.cc: the step loop's hooks ---
  bool on_error(int64_t s, const std::exception& e);
  void after_step(const StepStats& st);
  void print_step(const StepStats& st, double tok_s);
  void settle_checkpoint();

  // --- worker_epoch.cc ---
  // Joins the epoch the rank starts in; `rb`: its Rebuild.
  void start_state(const std::optional<membership::Rebuild>& rb);
  // The EpochRunner's steps (epoch_runner.h): the Rebuild taken before the communicators
  // (a new id, the Membership, the plugin), and once they stand, the Trainer made or
  // rebound and the controller's restore step loaded (`rb` null: the job's start state).
  EpochRunner::Steps epoch_steps();
  void take_rebuild(const membership::Rebuild& rb);
  void load_epoch(const membership::Rebuild* rb);
  ProcessGroups make_groups(int epoch, const std::atomic<bool>* cancel);
  void make_trainer();
  // A grown replica's ranks get the state (and its step) from their DP group's first rank,
  // which every survivor of the group holds equally.
  void receive_state_from_replica();
  // The state the job starts from: --resume (or, after restart_all, the newest checkpoint),
  // model.init_checkpoint, or a fresh init.
  void load_start_state();
  // Loads the controller's restore step into the state, from where the Rebuild says (the
  // persistent checkpoint, the start state) or else from the rank's own copies: its live
  // state, its snapshot, its backup holder's. Records the source for the incident.
  void restore(const membership::Rebuild& rb);
  // The job's data parallelism shrank or grew: this surviving rank becomes `rank` of the
  // Rebuild's layout. Its state is the same (replicas are equal without ZeRO-1), laid out
  // again (the flat buffers are padded to a multiple of dp); its snapshot names move to the
  // new id after the next rendezvous, when every rank has let go of its old ones.
  void relayout(int rank, const membership::Rebuild& rb);
  // The job reshaped (recovery.on_no_standby = reshape, launcher/worker/worker_reshape.cc):
  // this survivor becomes `rank` of another layout. Its new state is read from the old
  // layout's copies in memory, only the byte ranges it needs (or loaded from the persistent
  // checkpoint when the Rebuild says so); its old backup server serves the others until
  // every new rank has read.
  void reshape(int rank, const membership::Rebuild& rb);
  // Reads rank `rank`'s state of the applied layout from the copies of the layout before
  // (rb.reshard_from) in memory, then waits until every rank of the new layout has read.
  // Nothing when the Rebuild restores a persistent checkpoint. Throws RestoreError.
  void read_old_layout(int rank, const membership::Rebuild& rb, TrainState& into);
  // Becomes `rank` of the applied layout with the state `next` (relayout, reshape).
  void take_id(int rank, std::unique_ptr<TrainState> next);
  CheckpointLayout checkpoint_layout() const;
  Millis comm_timeout() const { return Millis(cfg_.parallel().comm_timeout_ms()); }
  int epoch() const { return epochs_.epoch(); }
  ProcessGroups& groups() { return *epochs_.groups(); }

  // --- worker_update.cc ---
  UpdateWatcher::Check update_check();
  void update_before_step(int64_t s);
  void update_after_step(const StepStats& st);
  // This process runs `path` (build `hash`) from now on, unless it already does.
  void adopt_plugin(const std::string& path, const std::string& hash);
  // A process started after an update runs the job's current plugin.
  void adopt_current_plugin();

  // --- worker_report.cc ---
  void finish();
  void fill_report(RunReport* rep);
  // The MFU for `tokens_per_s`; a stale peak is named (and its cache dropped) once.
  Mfu mfu(double tokens_per_s) {
    return mfu_.measure(trainer_->model_flops_per_token() * tokens_per_s);
  }
  // The traced communicators' activity (null without a controller to report to).
  std::shared_ptr<CommActivity> activity() const {
    return reporter_ ? reporter_->activity() : nullptr;
  }

  WorkerOptions o_;
  RankEnv env_;
  config::JobConfig cfg_;
  AppliedMembership members_;  // the layout in force
  bool leader_ = false;
  MfuGauge mfu_;  // rank 0's peak
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<Plugin> plugin_;
  std::unique_ptr<DataLoader> data_, val_;
  std::function<std::shared_ptr<Store>()> connect_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<Store> step_store_;      // on the step's path: short deadlines (store_address.h)
  std::string listen_host_ = "127.0.0.1";  // where this rank's sockets listen
  std::unique_ptr<TrainState> state_;
  EpochRunner epochs_;  // the epoch, its communicators, the move to the next
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<FaultInjector> injector_;
  std::unique_ptr<RecoveryClient> recovery_;
  std::unique_ptr<ProgressReporter> reporter_;
  std::unique_ptr<LeaderLink> leader_link_;  // with etcd: where the leader controller is now
  RoundMeter round_meter_{0};                // sized in setup() from detect.slow_round_steps
  std::unique_ptr<SnapshotSet> snapshots_;
  std::unique_ptr<SdcChecker> sdc_;
  std::unique_ptr<UpdateWatcher> updates_;
  std::unique_ptr<Probation> probation_;
  std::unique_ptr<JobRecord> record_;
  // Rank 0's records kept on another machine (used on the rank record_witness names).
  StepWitness witness_;
  int witness_rank_ = -1;  // record_witness of the layout in force
  // A rank started alone owns its job: it holds the checkpoint directory as keel-launch and
  // keel-worker --nproc do for theirs, so that no other job writes its steps there meanwhile.
  std::optional<CheckpointDirLock> ckpt_lock_;
  int exit_code_ = 0;  // once the job is done: kExitWriteFailed if a file could not be written
};

}  // namespace keel::worker_detail
