#include "launcher/worker/job_record.h"

#include <algorithm>

#include "launcher/job_history.h"
#include "launcher/recovery_protocol.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/logging.h"

namespace keel {

using recovery::unix_now;

void JobRecord::register_pid(Store& store, int rank, int pid) {
  report::RankProcesses p;
  p.set_rank(rank);
  p.add_pids(pid);
  set_message(store, keys::pid_key(rank, store.add(keys::pid_count_key(rank), 1) - 1), p);
}

void JobRecord::claim_start_step(Store& store, int64_t step) {
  if (store.add(keys::kStartStepClaimed, 1) != 1) return;
  store::Step s;
  s.set_step(step);
  set_message(store, keys::kStartStep, s);
}

void JobRecord::eval(Store& store, int64_t steps, double loss) {
  store::Eval e;
  e.set_loss(loss);
  set_message(store, keys::eval_key(steps), e);
}

void JobRecord::new_epoch(int epoch) {
  epoch_ = epoch;
  first_step_in_epoch_ = true;
}

report::StepRecord JobRecord::record_of(const StepStats& st, int epoch) {
  report::StepRecord r;
  r.set_step(st.step);
  r.set_epoch(epoch);
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
  return r;
}

void JobRecord::step(Store& store, const StepStats& st, double model_flops_per_token,
                     const Peak& peak) {
  steps_.erase(steps_.lower_bound(st.step), steps_.end());
  steps_[st.step] = record_of(st, epoch_).SerializeAsString();
  live_step_s_ += st.wall_s;
  progress_.set_step(st.step + 1);
  progress_.set_epoch(epoch_);
  if (supervised_) {
    const double tok_s = double(st.tokens) / st.wall_s;
    live_.set_tokens_per_s(tok_s);
    live_.set_ettr(live_step_s_ / std::max(1e-9, unix_now() - job_start_));
    live_.set_mfu(honest_mfu(model_flops_per_token * tok_s, peak).value);
  }
  bool now = unix_now() - flushed_at_ >= kFlushEverySeconds;
  if (first_step_in_epoch_) {
    // When the epoch's first step ended: the recovery's cost, read at once.
    first_step_in_epoch_ = false;
    store::Time t;
    t.set_at(unix_now());
    others_.emplace_back(keys::first_step_key(epoch_), t.SerializeAsString());
    now = true;
  }
  if (now) flush(store);
  if (nan_incident_.step() == st.step && !nan_incident_.kind().empty()) {
    nan_incident_.set_first_step_at(unix_now());
    const int64_t n = store.add(keys::kIncidentCount, 1) - 1;
    set_message(store, keys::incident_key(n), nan_incident_);
    nan_incident_.Clear();
  }
}

void JobRecord::flush(Store& store) {
  if (steps_.empty() && others_.empty()) return;
  std::vector<std::pair<std::string, std::string>> all = others_;
  for (const auto& [step, record] : steps_) all.emplace_back(keys::step_key(step), record);
  all.emplace_back(keys::kProgress, progress_.SerializeAsString());
  if (supervised_) all.emplace_back(keys::kLive, live_.SerializeAsString());
  flushed_at_ = unix_now();  // a store out of reach is tried again a second later, not each step
  try {
    store.set_all(all);
  } catch (const CommError& e) {
    // etcd without quorum: training goes on; the records wait for the next try.
    LOG(WARNING) << "the steps' records wait: " << e.what();
    return;
  }
  steps_.clear();
  others_.clear();
}

bool JobRecord::retry_nonfinite(int64_t s, bool leader, const std::string& what) {
  if (nonfinite_retried_ == s) return false;
  nonfinite_retried_ = s;
  if (!leader) return true;
  nan_incident_.set_kind("nan");
  nan_incident_.set_rank(-1);
  nan_incident_.set_step(int(s));
  nan_incident_.set_detected_at(unix_now());
  nan_incident_.set_recovered_at(unix_now());
  nan_incident_.set_restored_step(int(s));
  nan_incident_.set_steps_lost(0);
  nan_incident_.set_action("update skipped; step retried");
  nan_incident_.set_detail(what);
  nan_incident_.set_epoch(epoch_);
  return true;
}

}  // namespace keel
