// One rank's step: runs the plugin's stage under the 1F1B schedule, moves activations over
// the PP communicator, reduces gradients over the embedding and DP groups, clips, and steps
// AdamW. It borrows the TrainState (every byte that must survive), the plugin and the
// communicators, and owns only scratch, so any of the three can be swapped under it:
// rebind() takes communicators of a new epoch after a failure. It knows nothing of
// checkpoints or faults: those attach through the hooks here and the step loop in
// keel-worker.
//
// A step is a transaction. A CommError anywhere in it (also between a ZeRO-1 shard update
// and the all-gather) propagates as the typed exception and leaves the TrainState exactly as
// it was at the step's start; so does a non-finite loss or gradient norm (NonFiniteStep),
// which is caught before the update.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/data_loader.h"
#include "model/ops_table.h"
#include "model/param_store.h"
#include "model/plugin_loader.h"
#include "model/train_state.h"
#include "parallel/grad_sync.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/process_groups.h"
#include "parallel/topology.h"
#include "proto/config.pb.h"
#include "runtime/backend.h"

namespace keel {

struct StepStats {
  int64_t step = 0;
  double loss = 0;  // mean token loss over the global batch
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double wall_s = 0;
  // This rank's wall time split: computing (incl. the optimizer), waiting in TP/DP/embedding
  // collectives, and waiting for pipeline neighbours (the bubble).
  double compute_s = 0, comm_s = 0, bubble_s = 0;
  // Bytes this rank sent per communicator during the step.
  uint64_t bytes_tp = 0, bytes_pp = 0, bytes_dp = 0, bytes_emb = 0;
  int64_t tokens = 0;  // global tokens of the step
};

// The global loss or gradient norm of a step was NaN or infinite. Thrown on every rank alike
// (both are all-reduced) before the update, so the state is untouched.
class NonFiniteStep : public Error {
 public:
  NonFiniteStep(const std::string& what, int64_t step) : Error(what), step_(step) {}
  int64_t step() const { return step_; }

 private:
  int64_t step_;
};

// What a silent data corruption check compares and an sdc fault corrupts (DESIGN.md,
// Determinism): a micro-batch's gradient, a stage-boundary activation, the parameters and the
// optimizer moments after an update.
enum class TensorClass { kGrad, kActivation, kParam, kOptimizer };
// "grad", "activation", "param", "optimizer".
const char* tensor_class_name(TensorClass c);

// Where robust/ and ckpt/ attach inside a step. All optional.
struct TrainerHooks {
  // Right before the optimizer mutates the TrainState: a snapshot copy of the previous step
  // still in flight must finish here (it overlapped this step's forward and backward).
  std::function<void(int64_t step)> before_update;
  // This rank's local {loss_sum, grad_sumsq} before they are all-reduced (fault injection).
  std::function<void(int64_t step, float* metrics)> local_metrics;
  // A tensor this rank just computed, before anything reads it (fault injection: a defective
  // unit). kGrad: the gradient buffer after the step's first backward; kActivation: the stage's
  // boundary activation of the step's first micro-batch (its output; on the last stage the
  // input it received; on a single stage the first B·T·C floats of its saved activations, the
  // GPT's embedding); kParam, kOptimizer: the parameters and the moments after the update.
  // `recompute`: the same tensor of a micro-batch recomputed for a check (check_step()).
  std::function<void(int64_t step, TensorClass cls, float* data, size_t n, bool recompute)>
      computed;
};

// What one micro-batch computed on this rank, as digests (runtime/block_digest.h), for the
// silent data corruption check: a DP replica holds the same parameter shard, reads the same
// data and runs the same kernels, so recomputing another replica's micro-batch must give
// equal digests bit for bit (DESIGN.md, Determinism).
struct MicroBatchDigest {
  uint64_t grad = 0;        // this rank's gradient of the micro-batch alone
  uint64_t activation = 0;  // its stage-boundary activation (TrainerHooks::computed)
  bool operator==(const MicroBatchDigest&) const = default;
};

class Trainer {
 public:
  // Borrows everything: `state` (laid out by make_train_state for this rank), `groups` and
  // `data` must outlive the Trainer (or, for groups, the next rebind()).
  Trainer(const config::JobConfig& cfg, Backend* backend, std::shared_ptr<Plugin> plugin,
          const Topology& topo, int rank, TrainState* state, ProcessGroups* groups,
          DataLoader* data);
  ~Trainer();

  // Fresh weights from train.seed, or model.init_checkpoint when set; step 0, zero moments.
  void init_params();

  // Swaps in the communicators of a new epoch. The state, the plugin and the scratch stay;
  // the next step() runs on `groups`.
  void rebind(ProcessGroups* groups);
  void set_hooks(TrainerHooks hooks) { hooks_ = std::move(hooks); }

  // Swaps in another build of the model's code between steps (a hot update): `next` must
  // describe exactly the parameters the state was laid out for at this coordinate (names,
  // shapes, TP split, flags, ties); otherwise it throws InputError naming the plugin and the
  // first difference, and the Trainer goes on with its plugin. The state, the communicators
  // and the step are untouched; activation and scratch buffers grow if `next` needs more.
  void replace_plugin(std::shared_ptr<Plugin> next);
  const std::shared_ptr<Plugin>& plugin() const { return plugin_; }

  // Runs optimizer step state.step() (0-based), advances state.step() and returns the step's
  // metrics (loss and grad norm are global, identical on every rank). Throws CommError or
  // NonFiniteStep with the state as it was before the call.
  StepStats step();

  // The next step() records the digests of its first micro-batch (first_micro_batch()).
  void record_first_micro_batch(bool on = true) { record_first_ = on; }
  const MicroBatchDigest& first_micro_batch() const { return first_digest_; }

  // Recomputes micro-batch 0 of DP replica `replica`'s slice of step state().step() on this
  // rank's pipeline, into scratch gradients: the state, the step's gradients and the data
  // order are untouched, so it may run between steps or in the before_update hook. Every rank
  // of this DP replica calls it at the same point with the same `replica` (it moves
  // activations over the PP communicator and the plugin's TP ops communicate). The
  // `computed` hook sees its tensors with recompute = true. Throws CommError.
  MicroBatchDigest recompute_first_micro_batch(int replica);

  // Mean token loss over global batches [0, batches) of `val` (forward only, through the
  // pipeline; parameters and optimizer state untouched). Identical on every rank.
  double evaluate(const DataLoader& val, int batches);

  // Full tensors of the whole model gathered to global rank 0 (empty elsewhere). Every rank
  // must call it. Tied copies are left out (they equal their originals).
  NamedTensors gather_full_params();
  // The canonical parameter order (the single-rank describe order).
  std::vector<std::string> canonical_names() const;

  int64_t global_param_count() const { return global_params_; }
  // Model FLOPs per token for MFU, as the plugin counts them (the GPT: 6·N + 12·L·d·T).
  double model_flops_per_token() const { return plugin_->table().flops_per_token(&dims_); }
  const keel_model_dims& dims() const { return dims_; }
  const keel_stage& stage() const { return stage_; }
  ParamStore& params() { return state_->params(); }
  TrainState& state() { return *state_; }
  int micro_batches() const { return micro_batches_; }

 private:
  struct Slot;  // per in-flight micro-batch buffers
  void load_batch(const DataLoader& data, int64_t step, int micro_batch, Slot& slot,
                  int replica = -1);  // -1: this rank's DP replica
  // A digest of `n` floats of the backend's memory.
  uint64_t digest(const float* data, size_t n);
  // The step's first micro-batch computed `cls` in `data`: the fault hook, then the digest.
  void computed_first(int64_t step, TensorClass cls, float* data, size_t n);
  keel_stage_args stage_args(Slot& slot);
  // Throws CommAborted if a communicator of the step was aborted from another thread (the
  // recovery watcher: the epoch is over), between two pieces of compute.
  void throw_if_aborted(int64_t step) const;
  void run_plugin(int (*fn)(const keel_model_dims*, const keel_stage*, keel_stage_args*),
                  keel_stage_args* args);
  double local_grad_sumsq();
  void optimizer_step(int64_t step, double lr, float clip_scale);
  void update_out_of_place(const TrainState::Target& t, int64_t step, AdamWParams p, size_t lo,
                           size_t hi);
  void bind_groups();
  bool zero1() const;  // ZeRO-1 with more than one DP replica

  config::JobConfig cfg_;
  Backend* backend_;
  std::shared_ptr<Plugin> plugin_;
  Topology topo_;
  int rank_;
  Coord coord_;
  ProcessGroups* groups_;
  DataLoader* data_;
  keel_model_dims dims_;
  keel_stage stage_;
  bool first_, last_;
  int micro_batches_;
  int64_t global_params_ = 0;

  TrainState* state_;
  TrainerHooks hooks_;
  std::unique_ptr<OpsTable> ops_;
  std::unique_ptr<GradSync> sync_;
  std::vector<PipelineAction> schedule_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<GradSegment> segments_;
  std::vector<float*> param_ptrs_, grad_ptrs_;
  // ZeRO-1's undo log: this rank's shard of parameters and moments before the update, put
  // back if the all-gather that follows it fails.
  float* undo_ = nullptr;         // ZeRO-1 in place: this shard before the update
  std::vector<uint64_t> hashes_;  // block hashes of an out-of-place update
  float *scratch_ = nullptr, *dout_ = nullptr, *dinput_ = nullptr, *output_ = nullptr;
  std::vector<int32_t> host_inputs_, host_targets_;  // staging for load_batch
  int tied_slot_ = -1;      // index of the tied embedding in this coordinate, if it has one
  size_t used_floats_ = 0;  // parameters without the padding
  size_t act_floats_ = 0, scratch_floats_ = 0;  // what slots_ and scratch_ hold
  // The SDC check (trainer_check.cc).
  bool record_first_ = false;
  MicroBatchDigest first_digest_;
  float* check_grads_ = nullptr;  // a recomputed micro-batch's gradients
  std::vector<float*> check_grad_ptrs_;
  std::vector<uint8_t> host_digest_;  // staging for a digest of device memory
};

// Lays out `rank`'s TrainState for this config and plugin (parameters of its coordinate;
// moments of its ZeRO-1 shard where sharded).
std::unique_ptr<TrainState> make_train_state(const config::JobConfig& cfg, Backend* backend,
                                             const Plugin& plugin, const Topology& topo, int rank);

}  // namespace keel
