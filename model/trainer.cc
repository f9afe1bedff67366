#include "model/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "model/hf_checkpoint.h"
#include "model/job_layout.h"
#include "model/llmc_checkpoint.h"
#include "model/lr_schedule.h"
#include "model/trainer_slot.h"
#include "parallel/comm_error.h"
#include "runtime/block_digest.h"
#include "runtime/check.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One tag for all pipeline traffic: each direction between two stages is FIFO and the
// schedule fixes the order, so the tag only guards against a protocol bug.
constexpr uint32_t kPipeTag = 0x1F1B;

}  // namespace

std::unique_ptr<TrainState> make_train_state(const config::JobConfig& cfg, Backend* backend,
                                             const Plugin& plugin, const Topology& topo, int rank) {
  const Coord c = topo.coord(rank);
  return std::make_unique<TrainState>(backend, plugin.describe(model_dims(cfg), stage_of(cfg, c)),
                                      c.tp, topo.tp(), topo.dp(), cfg.parallel().zero1());
}

Trainer::Trainer(const config::JobConfig& cfg, Backend* backend, std::shared_ptr<Plugin> plugin,
                 const Topology& topo, int rank, TrainState* state, ProcessGroups* groups,
                 DataLoader* data)
    : cfg_(cfg),
      backend_(backend),
      plugin_(std::move(plugin)),
      topo_(topo),
      rank_(rank),
      coord_(topo.coord(rank)),
      groups_(groups),
      data_(data),
      state_(state) {
  dims_ = model_dims(cfg_);
  stage_ = stage_of(cfg_, coord_);
  first_ = coord_.pp == 0;
  last_ = coord_.pp == topo_.pp() - 1;
  const int B = cfg_.train().micro_batch_size(), T = dims_.seq_len, C = dims_.hidden_size;
  micro_batches_ = cfg_.train().global_batch_size() / (B * topo_.dp());

  // The whole model's size: the single-rank description counts every parameter once.
  for (const auto& d : plugin_->describe(dims_, single_rank_stage(cfg_)))
    global_params_ += int64_t(global_numel(d));

  ParamStore& ps = state_->params();
  for (size_t i = 0; i < ps.slots().size(); ++i) {
    const ParamSlot& s = ps.slots()[i];
    param_ptrs_.push_back(ps.param(int(i)));
    grad_ptrs_.push_back(ps.grad(int(i)));
    // A tied parameter's gradient is summed over the embedding group before the DP
    // reduction, so its bucket never starts early.
    const bool tied = s.desc.tied_to[0] != '\0';
    if (tied) tied_slot_ = int(i);
    segments_.push_back({s.offset, s.numel, tied});
    used_floats_ = std::max(used_floats_, s.offset + s.numel);
  }
  bind_groups();

  schedule_ = one_f_one_b(coord_.pp, topo_.pp(), micro_batches_);
  const int in_flight = max_in_flight(coord_.pp, topo_.pp(), micro_batches_);
  const size_t act = plugin_->table().activation_floats(&dims_, &stage_, B, T);
  const size_t hidden = size_t(B) * T * C;
  for (int i = 0; i < in_flight; ++i) {
    auto s = std::make_unique<Slot>(backend_);
    s->tokens = static_cast<int32_t*>(backend_->alloc(size_t(B) * T * sizeof(int32_t)));
    s->targets = static_cast<int32_t*>(backend_->alloc(size_t(B) * T * sizeof(int32_t)));
    if (!first_) s->input = static_cast<float*>(backend_->alloc(hidden * sizeof(float)));
    s->activations = static_cast<float*>(backend_->alloc(std::max<size_t>(act, 1) * sizeof(float)));
    slots_.push_back(std::move(s));
  }
  act_floats_ = std::max<size_t>(act, 1);
  const size_t scratch = plugin_->table().scratch_floats(&dims_, &stage_, B, T);
  scratch_floats_ = std::max<size_t>(scratch, 1);
  scratch_ = static_cast<float*>(backend_->alloc(scratch_floats_ * sizeof(float)));
  if (!last_) {
    output_ = static_cast<float*>(backend_->alloc(hidden * sizeof(float)));
    dout_ = static_cast<float*>(backend_->alloc(hidden * sizeof(float)));
  }
  if (!first_) dinput_ = static_cast<float*>(backend_->alloc(hidden * sizeof(float)));
}

Trainer::~Trainer() {
  for (float* p : {scratch_, dout_, dinput_, output_, undo_, check_grads_}) backend_->free(p);
}

bool Trainer::zero1() const {
  return cfg_.parallel().zero1() && topo_.dp() > 1;
}

void Trainer::bind_groups() {
  ParamStore& ps = state_->params();
  sync_ = std::make_unique<GradSync>(groups_->dp.get(), ps.grads(), ps.padded_numel(), segments_,
                                     size_t(cfg_.parallel().bucket_mb() * 1024 * 1024),
                                     cfg_.parallel().zero1());
  ops_ = std::make_unique<OpsTable>(backend_, topo_.tp() > 1 ? groups_->tp.get() : nullptr);
  ops_->set_grad_ready([this](int i) { sync_->mark_ready(i); });
  ops_->set_abort_probe([this] { return groups_->any_aborted(); });
}

void Trainer::rebind(ProcessGroups* groups) {
  groups_ = groups;
  bind_groups();
}

void Trainer::init_params() {
  const std::string& ckpt = cfg_.model().init_checkpoint();
  ParamStore& ps = state_->params();
  if (!ckpt.empty()) refuse_directory_without_weights(ckpt);  // not "shorter than a header"
  if (ckpt.empty()) {
    ps.init(cfg_.train().seed());
  } else if (is_hf_checkpoint(ckpt)) {
    ps.load_full(read_hf_checkpoint(ckpt, *plugin_, dims_,
                                    plugin_->describe(dims_, single_rank_stage(cfg_))),
                 ckpt + "/model.safetensors");
  } else {
    ps.load_full(read_llmc_checkpoint(ckpt, dims_), ckpt);
  }
  for (const StateSpan& sp : state_->spans())
    if (sp.data != ps.params()) backend_->fill(sp.data, sp.floats, 0.0f);
  state_->set_step(0);
}

void Trainer::load_batch(const DataLoader& data, int64_t step, int m, Slot& slot, int replica) {
  if (!first_ && !last_) return;
  const int B = cfg_.train().micro_batch_size(), T = dims_.seq_len;
  const int G = cfg_.train().global_batch_size();
  const int first_sample = (replica < 0 ? coord_.dp : replica) * (G / topo_.dp()) + m * B;
  host_inputs_.resize(size_t(B) * T);
  host_targets_.resize(size_t(B) * T);
  data.read(step, G, first_sample, B, host_inputs_.data(), host_targets_.data());
  const size_t bytes = host_inputs_.size() * sizeof(int32_t);
  backend_->copy_from_host(slot.tokens, host_inputs_.data(), bytes);
  backend_->copy_from_host(slot.targets, host_targets_.data(), bytes);
}

void Trainer::throw_if_aborted(int64_t step) const {
  // A step whose peers are gone cannot complete: a survivor that learns it from the abort
  // acknowledges it now instead of computing the rest of the step first (a whole backward,
  // seconds of a large model, with DP buckets that only fail in the background). Nothing of
  // the step has been applied; the recovery restores the state it began from.
  if (groups_->any_aborted())
    throw CommAborted(detail::concat("step ", step + 1, ": the epoch was aborted"));
}

StepStats Trainer::step() {
  const int64_t step = state_->step();
  const auto t_start = Clock::now();
  ParamStore& params = state_->params();
  const int B = cfg_.train().micro_batch_size(), T = dims_.seq_len;
  const size_t hidden_bytes = size_t(B) * T * dims_.hidden_size * sizeof(float);
  const CommStats tp0 = groups_->tp->stats(), pp0 = groups_->pp->stats(),
                  dp0 = groups_->dp->stats(), emb0 = groups_->emb->stats(),
                  world0 = groups_->world->stats();
  StepStats st;
  st.step = step;
  st.tokens = int64_t(cfg_.train().global_batch_size()) * T;
  // The first micro-batch's gradient is read (by a check or a fault) before any of it is
  // reduced: with a single micro-batch its buckets then start only after its backward.
  const bool watch_first = record_first_ || bool(hooks_.computed);
  const bool late_arm = watch_first && micro_batches_ == 1;
  first_digest_ = {};

  params.zero_grads();
  const float loss_scale = 1.0f / float(int64_t(cfg_.train().global_batch_size()) * T);
  double loss_sum = 0;
  bool have_input = false, have_dout = false;  // received by a fused send_recv
  Communicator* pp = groups_->pp.get();
  const int prev = coord_.pp - 1, next = coord_.pp + 1;
  const int n_slots = int(slots_.size());

  for (size_t i = 0; i < schedule_.size(); ++i) {
    throw_if_aborted(step);
    const PipelineAction& a = schedule_[i];
    Slot& slot = *slots_[a.micro_batch % n_slots];
    keel_stage_args args = stage_args(slot);
    args.loss_scale = loss_scale;
    if (a.kind == PipelineAction::kForward) {
      if (a.recv_input && !have_input) pp->recv(slot.input, hidden_bytes, prev, kPipeTag);
      have_input = false;
      load_batch(*data_, step, a.micro_batch, slot);
      if (watch_first && a.micro_batch == 0 && last_ && !first_)
        computed_first(step, TensorClass::kActivation, slot.input, hidden_bytes / sizeof(float));
      args.output = output_;
      run_plugin(plugin_->table().forward, &args);
      if (watch_first && a.micro_batch == 0 && (!last_ || first_))
        computed_first(step, TensorClass::kActivation, last_ ? slot.activations : output_,
                       hidden_bytes / sizeof(float));
      if (last_) loss_sum += args.loss_sum;
      if (a.send_output) {
        if (a.fused_with_next) {
          pp->send_recv(output_, hidden_bytes, next, dout_, hidden_bytes, next, kPipeTag);
          have_dout = true;
        } else {
          pp->send(output_, hidden_bytes, next, kPipeTag);
        }
      }
    } else {
      if (a.recv_grad && !have_dout) pp->recv(dout_, hidden_bytes, next, kPipeTag);
      have_dout = false;
      if (a.micro_batch == micro_batches_ - 1 && !late_arm) sync_->arm();
      args.dout = dout_;
      args.dinput = dinput_;
      run_plugin(plugin_->table().backward, &args);
      if (watch_first && a.micro_batch == 0)
        computed_first(step, TensorClass::kGrad, params.grads(), used_floats_);
      if (late_arm) {
        sync_->arm();
        for (size_t k = 0; k < segments_.size(); ++k) sync_->mark_ready(int(k));
      }
      if (a.send_grad) {
        if (a.fused_with_next) {
          Slot& next_slot = *slots_[schedule_[i + 1].micro_batch % n_slots];
          pp->send_recv(dinput_, hidden_bytes, prev, next_slot.input, hidden_bytes, prev, kPipeTag);
          have_input = true;
        } else {
          pp->send(dinput_, hidden_bytes, prev, kPipeTag);
        }
      }
    }
  }

  // The tied embedding: its gradient is the sum of the first stage's (embedding) and the
  // last stage's (head) contributions, as Megatron's embedding group does.
  if (tied_slot_ >= 0)
    groups_->emb->all_reduce(params.grad(tied_slot_), params.slots()[tied_slot_].numel);
  const auto t_dp = Clock::now();
  sync_->finish();
  const double dp_wait_s = since(t_dp);

  // Global loss and gradient norm in one world all-reduce of two floats.
  float metrics[2] = {last_ && coord_.tp == 0 ? float(loss_sum) : 0.0f, float(local_grad_sumsq())};
  if (hooks_.local_metrics) hooks_.local_metrics(step, metrics);
  groups_->world->all_reduce(metrics, 2);
  st.loss = double(metrics[0]) * loss_scale;
  st.grad_norm = std::sqrt(double(metrics[1]));
  // Both are global, so every rank refuses the same step; nothing has been updated yet.
  if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm))
    throw NonFiniteStep(detail::concat("step ", step + 1, ": loss ", st.loss, ", gradient norm ",
                                       st.grad_norm, " (not finite); the update was not applied"),
                        step);
  const float clip = cfg_.optim().grad_clip();
  float clip_scale = 1.0f;
  if (clip > 0 && st.grad_norm > clip) clip_scale = float(clip / (st.grad_norm + 1e-6));
  st.lr = learning_rate(cfg_.optim(), step, cfg_.train().steps());
  if (hooks_.before_update) hooks_.before_update(step);
  optimizer_step(step, st.lr, clip_scale);
  backend_->synchronize();
  state_->set_step(step + 1);
  record_first_ = false;
  if (hooks_.computed) {
    const std::vector<StateSpan> spans = state_->spans();
    hooks_.computed(step, TensorClass::kParam, spans[0].data, used_floats_, false);
    hooks_.computed(step, TensorClass::kOptimizer, spans[1].data, spans[1].floats, false);
  }

  st.wall_s = since(t_start);
  auto delta = [](const CommStats& a, const CommStats& b) {
    CommStats d;
    d.bytes_sent = a.bytes_sent - b.bytes_sent;
    d.wait_s = a.wait_s - b.wait_s;
    return d;
  };
  CommStats tp = delta(groups_->tp->stats(), tp0), ppd = delta(groups_->pp->stats(), pp0),
            dp = delta(groups_->dp->stats(), dp0), emb = delta(groups_->emb->stats(), emb0),
            world = delta(groups_->world->stats(), world0);
  st.bytes_tp = tp.bytes_sent;
  st.bytes_pp = ppd.bytes_sent;
  st.bytes_dp = dp.bytes_sent;
  st.bytes_emb = emb.bytes_sent;
  st.bubble_s = ppd.wait_s;
  // DP buckets reduce on a background thread while backward computes; only the time the
  // step itself waited for them (in finish()) counts.
  st.comm_s = std::min(st.wall_s - st.bubble_s, tp.wait_s + emb.wait_s + world.wait_s + dp_wait_s);
  st.compute_s = std::max(0.0, st.wall_s - st.bubble_s - st.comm_s);
  return st;
}

keel_stage_args Trainer::stage_args(Slot& slot) {
  keel_stage_args args{};
  args.ops = ops_->ops();
  // Refreshed every call: a state living in its snapshot banks moves to the other bank at
  // every update (model/train_state.h).
  ParamStore& ps = state_->params();
  for (size_t i = 0; i < param_ptrs_.size(); ++i) param_ptrs_[i] = ps.param(int(i));
  args.params = param_ptrs_.data();
  args.grads = grad_ptrs_.data();
  args.B = cfg_.train().micro_batch_size();
  args.T = dims_.seq_len;
  args.tokens = slot.tokens;
  args.targets = slot.targets;
  args.input = slot.input;
  args.activations = slot.activations;
  args.scratch = scratch_;
  return args;
}

void Trainer::run_plugin(int (*fn)(const keel_model_dims*, const keel_stage*, keel_stage_args*),
                         keel_stage_args* args) {
  const int rc = fn(&dims_, &stage_, args);
  // A failed op is rethrown even if the plugin returned 0: a backend error inside a
  // non-communicating op has no status to travel back through.
  ops_->rethrow_if_failed();
  KEEL_CHECK(rc == 0, "plugin ", plugin_->name(), " returned ", rc, " (bad arguments)");
}

double Trainer::evaluate(const DataLoader& val, int batches) {
  const int B = cfg_.train().micro_batch_size(), T = dims_.seq_len;
  const size_t hidden_bytes = size_t(B) * T * dims_.hidden_size * sizeof(float);
  Communicator* pp = groups_->pp.get();
  Slot& slot = *slots_[0];
  double loss_sum = 0;
  // Forward only: each stage receives, computes and passes on one micro-batch at a time, in
  // order, so plain send/recv cannot deadlock.
  for (int b = 0; b < batches; ++b)
    for (int m = 0; m < micro_batches_; ++m) {
      if (!first_) pp->recv(slot.input, hidden_bytes, coord_.pp - 1, kPipeTag);
      load_batch(val, b, m, slot);
      keel_stage_args args = stage_args(slot);
      args.output = output_;
      run_plugin(plugin_->table().forward, &args);
      if (last_) loss_sum += args.loss_sum;
      if (!last_) pp->send(output_, hidden_bytes, coord_.pp + 1, kPipeTag);
    }
  float total = last_ && coord_.tp == 0 ? float(loss_sum) : 0.0f;
  groups_->world->all_reduce(&total, 1);
  return double(total) / (double(batches) * cfg_.train().global_batch_size() * T);
}

double Trainer::local_grad_sumsq() {
  // Each element of the global model's gradient is counted once: TP-replicated parameters on
  // TP rank 0 only, tied copies never, and (without ZeRO-1, where DP replicas hold equal
  // gradients) on DP rank 0 only.
  const bool z = zero1();
  ParamStore& ps = state_->params();
  if (!z && coord_.dp != 0) return 0.0;
  const size_t lo = z ? sync_->shard_begin() : 0;
  const size_t hi = z ? lo + sync_->shard_numel() : ps.padded_numel();
  double sum = 0;
  for (const ParamSlot& s : ps.slots()) {
    if (s.tied_copy() || (!s.tp_sharded() && coord_.tp != 0)) continue;
    size_t b = std::max(lo, s.offset), e = std::min(hi, s.offset + s.numel);
    if (b < e) sum += backend_->sum_squares(ps.grads() + b, e - b);
  }
  return sum;
}

void Trainer::optimizer_step(int64_t step, double lr, float clip_scale) {
  const auto& o = cfg_.optim();
  ParamStore& ps = state_->params();
  AdamWParams p;
  p.lr = float(lr);
  p.beta1 = o.beta1();
  p.beta2 = o.beta2();
  p.eps = o.eps();
  p.grad_scale = clip_scale;
  p.t = step + 1;
  const bool z = zero1();
  const size_t lo = z ? sync_->shard_begin() : 0;
  const size_t shard = z ? sync_->shard_numel() : ps.padded_numel();
  const size_t hi = lo + shard;
  if (std::optional<TrainState::Target> t = state_->update_begin()) {
    update_out_of_place(*t, step, p, lo, hi);
    return;
  }
  if (z && !undo_)
    undo_ = static_cast<float*>(backend_->alloc(3 * sync_->shard_numel() * sizeof(float)));
  if (z) {
    backend_->copy(undo_, ps.params() + lo, shard * sizeof(float));
    backend_->copy(undo_ + shard, ps.m(), shard * sizeof(float));
    backend_->copy(undo_ + 2 * shard, ps.v(), shard * sizeof(float));
  }
  for (const ParamSlot& s : ps.slots()) {
    size_t b = std::max(lo, s.offset), e = std::min(hi, s.offset + s.numel);
    if (b >= e) continue;
    p.weight_decay = s.decays() ? o.weight_decay() : 0.0f;
    backend_->adamw(ps.params() + b, ps.grads() + b, ps.m() + (b - lo), ps.v() + (b - lo), e - b,
                    p);
  }
  if (!z) return;
  // The gradients are spent, so their buffer receives the all-gather; the parameters are
  // overwritten only once it has completed everywhere. A failure midway puts this rank's
  // shard and moments back from the undo log, and the other shards were never touched.
  backend_->copy(ps.grads() + lo, ps.params() + lo, shard * sizeof(float));
  try {
    sync_->all_gather_params(ps.grads());
  } catch (const CommError&) {
    backend_->copy(ps.params() + lo, undo_, shard * sizeof(float));
    backend_->copy(ps.m(), undo_ + shard, shard * sizeof(float));
    backend_->copy(ps.v(), undo_ + 2 * shard, shard * sizeof(float));
    throw;
  }
  backend_->copy(ps.params(), ps.grads(), ps.padded_numel() * sizeof(float));
}

// The step written into the state's other snapshot bank, hashed block by block as it is
// written, and committed there: the update is the snapshot. A failure before the commit (a
// CommError in the ZeRO-1 all-gather) leaves the live bank untouched, so no undo log is needed.
void Trainer::update_out_of_place(const TrainState::Target& t, int64_t step, AdamWParams p,
                                  size_t lo, size_t hi) {
  const auto& o = cfg_.optim();
  ParamStore& ps = state_->params();
  const size_t P = ps.padded_numel(), M = hi - lo;
  const size_t pb = P / kDigestBlockFloats, mb = M / kDigestBlockFloats;
  hashes_.resize(pb + 2 * mb);
  std::vector<AdamWSegment> segs;
  for (const ParamSlot& s : ps.slots()) {
    size_t b = std::max(lo, s.offset), e = std::min(hi, s.offset + s.numel);
    if (b < e) segs.push_back({b, e, s.decays() ? o.weight_decay() : 0.0f});
  }
  AdamWUpdate u;
  u.param = ps.params();
  u.grad = ps.grads();
  u.m = ps.m();
  u.v = ps.v();
  u.param_out = t.params;
  u.m_out = t.m;
  u.v_out = t.v;
  u.begin = lo;
  u.end = hi;
  u.segments = segs.data();
  u.num_segments = segs.size();
  u.param_hashes = hashes_.data();
  u.m_hashes = hashes_.data() + pb;
  u.v_hashes = hashes_.data() + pb + mb;
  backend_->adamw_update(u, p);
  if (zero1()) {
    // The other shards arrive straight in the target bank, then are hashed there.
    sync_->all_gather_params(t.params);
    backend_->hash_blocks(t.params, lo, hashes_.data());
    backend_->hash_blocks(t.params + hi, P - hi, hashes_.data() + hi / kDigestBlockFloats);
  }
  state_->update_commit(t, step + 1, combine_block_hashes(hashes_.data(), hashes_.size()));
}

std::vector<std::string> Trainer::canonical_names() const {
  std::vector<std::string> names;
  for (const auto& d : plugin_->describe(dims_, single_rank_stage(cfg_)))
    names.emplace_back(d.name, strnlen(d.name, KEEL_PARAM_NAME_MAX));
  return names;
}

NamedTensors Trainer::gather_full_params() {
  // Replicas along DP hold equal parameters, so the dp = 0 column sends its shards to rank 0
  // over the world group (host memory), coordinate by coordinate in a fixed order.
  constexpr uint32_t kGatherTag = 0x6A7;
  Communicator* world = groups_->world.get();
  NamedTensors full;
  if (rank_ != 0) {
    if (coord_.dp != 0) return full;
    auto local = state_->params().local_to_host();
    for (size_t i = 0; i < local.size(); ++i)
      if (!state_->params().slots()[i].tied_copy())
        world->send(local[i].data(), local[i].size() * sizeof(float), 0, kGatherTag);
    return full;
  }
  for (int p = 0; p < topo_.pp(); ++p)
    for (int t = 0; t < topo_.tp(); ++t) {
      const int src = topo_.rank({0, p, t});
      const keel_stage st = stage_of(cfg_, {0, p, t});
      std::vector<keel_param_desc> descs = plugin_->describe(dims_, st);
      std::vector<std::vector<float>> local;
      if (src == 0) local = state_->params().local_to_host();
      for (size_t i = 0; i < descs.size(); ++i) {
        const keel_param_desc& d = descs[i];
        if (d.flags & KEEL_PARAM_TIED_COPY) continue;
        std::string name(d.name, strnlen(d.name, KEEL_PARAM_NAME_MAX));
        size_t n = global_numel(d) / (d.tp_dim >= 0 ? size_t(topo_.tp()) : 1);
        std::vector<float> shard;
        if (src == 0) {
          shard = std::move(local[i]);
        } else {
          shard.resize(n);
          world->recv(shard.data(), n * sizeof(float), src, kGatherTag);
        }
        auto& dst = full[name];
        dst.resize(global_numel(d));
        full_from_shard(d, t, topo_.tp(), shard.data(), dst.data());
      }
    }
  return full;
}

}  // namespace keel
