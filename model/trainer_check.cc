// The Trainer's side of the silent data corruption check (DESIGN.md, Determinism): the
// digests of a step's first micro-batch, and the same micro-batch of another DP replica
// recomputed on this rank's pipeline. What the digests are compared with, and what a
// mismatch means, is robust/sdc_check.h's business.
#include <algorithm>
#include <cstring>

#include "model/trainer.h"
#include "model/trainer_slot.h"
#include "runtime/block_digest.h"
#include "runtime/check.h"

namespace keel {
namespace {

constexpr uint32_t kCheckTag = 0x5DC;  // its own tag: a check never meets a step's traffic

}  // namespace

const char* tensor_class_name(TensorClass c) {
  switch (c) {
    case TensorClass::kGrad:
      return "grad";
    case TensorClass::kActivation:
      return "activation";
    case TensorClass::kParam:
      return "param";
    case TensorClass::kOptimizer:
      return "optimizer";
  }
  return "?";
}

uint64_t Trainer::digest(const float* data, size_t n) {
  const size_t bytes = n * sizeof(float);
  // Host memory is hashed where it lies; device memory is staged (a device hash is future work:
  // the check is every N steps, so the copy is paid rarely).
  if (backend_->kind() == DeviceKind::kCpu) return block_digest(data, bytes);
  host_digest_.resize(bytes);
  backend_->copy_to_host(host_digest_.data(), data, bytes);
  return block_digest(host_digest_.data(), bytes);
}

void Trainer::computed_first(int64_t step, TensorClass cls, float* data, size_t n) {
  if (hooks_.computed) hooks_.computed(step, cls, data, n, false);
  if (!record_first_) return;
  uint64_t& d = cls == TensorClass::kGrad ? first_digest_.grad : first_digest_.activation;
  d = digest(data, n);
}

MicroBatchDigest Trainer::recompute_first_micro_batch(int replica) {
  const int64_t step = state_->step();
  const int B = cfg_.train().micro_batch_size(), T = dims_.seq_len;
  const size_t hidden = size_t(B) * T * dims_.hidden_size, hidden_bytes = hidden * sizeof(float);
  ParamStore& ps = state_->params();
  if (!check_grads_) {
    check_grads_ = static_cast<float*>(backend_->alloc(ps.padded_numel() * sizeof(float)));
    for (const ParamSlot& s : ps.slots()) check_grad_ptrs_.push_back(check_grads_ + s.offset);
  }
  backend_->fill(check_grads_, ps.padded_numel(), 0.0f);
  Communicator* pp = groups_->pp.get();
  Slot& slot = *slots_[0];
  MicroBatchDigest d;
  auto seen = [&](TensorClass cls, float* data, size_t n) {
    if (hooks_.computed) hooks_.computed(step, cls, data, n, true);
    return digest(data, n);
  };

  // Forward then backward through the stages one after another, as evaluate() does: with one
  // micro-batch in flight plain send/recv cannot deadlock.
  if (!first_) pp->recv(slot.input, hidden_bytes, coord_.pp - 1, kCheckTag);
  load_batch(*data_, step, 0, slot, replica);
  if (last_ && !first_) d.activation = seen(TensorClass::kActivation, slot.input, hidden);
  keel_stage_args args = stage_args(slot);
  args.grads = check_grad_ptrs_.data();
  args.loss_scale = 1.0f / float(int64_t(cfg_.train().global_batch_size()) * T);
  args.output = output_;
  run_plugin(plugin_->table().forward, &args);
  if (first_ && last_) d.activation = seen(TensorClass::kActivation, slot.activations, hidden);
  if (!last_) {
    d.activation = seen(TensorClass::kActivation, output_, hidden);
    pp->send(output_, hidden_bytes, coord_.pp + 1, kCheckTag);
    pp->recv(dout_, hidden_bytes, coord_.pp + 1, kCheckTag);
  }
  args.dout = dout_;
  args.dinput = dinput_;
  run_plugin(plugin_->table().backward, &args);
  d.grad = seen(TensorClass::kGrad, check_grads_, used_floats_);
  if (!first_) pp->send(dinput_, hidden_bytes, coord_.pp - 1, kCheckTag);
  backend_->synchronize();
  return d;
}

}  // namespace keel
