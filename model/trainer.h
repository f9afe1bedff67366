// The step loop of one rank: runs the plugin's stage under the 1F1B schedule, moves
// activations over the PP communicator, reduces gradients over the embedding and DP groups,
// clips, and steps AdamW. It knows nothing of checkpoints or faults: those attach through
// the step hooks (later issues) in keel-worker.
//
// A CommError from any communicator propagates out of step() as the typed exception; the
// Trainer's state is then that of the step's start plus partial gradients, which the next
// step zeroes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/data_loader.h"
#include "model/ops_table.h"
#include "model/param_store.h"
#include "model/plugin_loader.h"
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

class Trainer {
 public:
  // `groups` and `data` must outlive the Trainer. Loads nothing yet; call init_params().
  Trainer(const config::JobConfig& cfg, Backend* backend, std::shared_ptr<Plugin> plugin,
          const Topology& topo, int rank, ProcessGroups* groups, DataLoader* data);
  ~Trainer();

  // Fresh weights from train.seed, or model.init_checkpoint when set.
  void init_params();

  // Runs optimizer step `step` (0-based) and returns its metrics (loss and grad norm are
  // global, identical on every rank).
  StepStats step(int64_t step);

  // Mean token loss over global batches [0, batches) of `val` (forward only, through the
  // pipeline; parameters and optimizer state untouched). Identical on every rank.
  double evaluate(const DataLoader& val, int batches);

  // Full tensors of the whole model gathered to global rank 0 (empty elsewhere). Every rank
  // must call it. Tied copies are left out (they equal their originals).
  NamedTensors gather_full_params();
  // The canonical parameter order (the single-rank describe order).
  std::vector<std::string> canonical_names() const;

  int64_t global_param_count() const { return global_params_; }
  // Model FLOPs per token for MFU: 6·N + 12·L·d·T (the PaLM accounting llm.c uses).
  double model_flops_per_token() const {
    return 6.0 * double(global_params_) +
           12.0 * dims_.num_layers * double(dims_.hidden_size) * dims_.seq_len;
  }
  const keel_model_dims& dims() const { return dims_; }
  const keel_stage& stage() const { return stage_; }
  ParamStore& params() { return *params_; }
  int micro_batches() const { return micro_batches_; }

 private:
  struct Slot;  // per in-flight micro-batch buffers
  void load_batch(const DataLoader& data, int64_t step, int micro_batch, Slot& slot);
  keel_stage_args stage_args(Slot& slot);
  void run_plugin(int (*fn)(const keel_model_dims*, const keel_stage*, keel_stage_args*),
                  keel_stage_args* args);
  double local_grad_sumsq();
  void optimizer_step(int64_t step, double lr, float clip_scale);

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

  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<OpsTable> ops_;
  std::unique_ptr<GradSync> sync_;
  std::vector<PipelineAction> schedule_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<float*> param_ptrs_, grad_ptrs_;
  float *scratch_ = nullptr, *dout_ = nullptr, *dinput_ = nullptr, *output_ = nullptr;
  std::vector<int32_t> host_inputs_, host_targets_;  // staging for load_batch
  int wte_slot_ = -1;  // index of the tied embedding in this coordinate, if it has one
};

}  // namespace keel
