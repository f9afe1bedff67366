#include "launcher/controller/detector.h"

#include <algorithm>
#include <set>
#include <vector>

#include "launcher/recovery_protocol.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/fault_injector.h"
#include "robust/hang_rules.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// Agents send heartbeats every 200 ms: one silent for three of them may be dying with its
// slot, and its ranks' silence is not theirs.
constexpr double kAgentSilentS = 0.6;
// How often the hang rules look: their timeouts are seconds, and a look that may find a hang
// copies every rank's report (at 4,096 ranks, every 5 ms pass of the loop doing so was the
// top of the controller's profile; keel-bench control-plane).
constexpr std::chrono::milliseconds kHangCheckEvery{50};

}  // namespace

void Detector::new_epoch(int64_t start_step) {
  progress_.clear();
  epoch_start_step_ = std::max<int64_t>(0, start_step);
  last_min_step_ = -1;
  last_advance_ = Clock::now();
}

int64_t Detector::ahead() const {
  int64_t ahead = epoch_start_step_;
  for (const auto& [rk, p] : progress_) ahead = std::max<int64_t>(ahead, p.first.step());
  return ahead;
}

double Detector::median_step_s() const {
  std::vector<double> step_s;
  for (const auto& [r, p] : progress_)
    if (p.first.step_s() > 0) step_s.push_back(p.first.step_s());
  if (step_s.empty()) return 0;
  std::nth_element(step_s.begin(), step_s.begin() + long(step_s.size() / 2), step_s.end());
  return step_s[step_s.size() / 2];
}

Detected Detector::from_exit(const RankExit& ex) {
  Detected d;
  d.found.set_detected_at(recovery::unix_now());
  d.found.set_slot(ctx_.host->slot_of(ex.rank));
  d.found.set_kind(ex.slot_lost ? "slot_loss" : WIFSIGNALED(ex.status) ? "crash" : "exit");
  d.found.set_detail(detail::concat("rank ", ex.rank, " ", ex.describe()));
  d.failure.kind = ex.slot_lost             ? policy::FailureKind::kSlotLoss
                   : WIFSIGNALED(ex.status) ? policy::FailureKind::kCrash
                                            : policy::FailureKind::kExit;
  d.failure.culprit = ex.rank;
  d.failure.dead.insert(ex.rank);
  d.failure.rule = ex.slot_lost ? ex.lost_by : "exit";
  if (ex.slot_lost) {
    d.failure.lost_slots.insert(ex.slot);
    for (int r : ctx_.host->ranks_on(ex.slot)) d.failure.dead.insert(r);
    label_slot_loss(&d, ex);
  }
  return d;
}

std::optional<Detected> Detector::comm_error() {
  const int epoch = ctx_.members->epoch();
  if (ctx_.store->add(keys::errors_key(epoch), 0) <= 0) return std::nullopt;
  if (auto d = sdc()) return d;
  Detected d;
  d.found.set_detected_at(recovery::unix_now());
  d.found.set_slot(-1);
  d.failure.kind = policy::FailureKind::kCommError;
  // New code on probation broke the training: the ranks said why.
  if (auto f =
          try_get_message<store::UpdateFailure>(*ctx_.store, keys::update_failure_key(epoch))) {
    d.found.set_kind("update_failure");
    d.found.set_detail(f->why());
    d.failure.rule = "probation";
  } else {
    d.found.set_kind("comm_error");
    d.found.set_detail("a communication error");
    d.failure.rule = "comm_error";
  }
  return d;
}

std::optional<Detected> Detector::sdc() {
  const std::optional<std::string> verdict =
      ctx_.store->try_get(keys::sdc_verdict_key(ctx_.members->epoch()));
  if (!verdict) return std::nullopt;  // the ranks' error is not an SDC verdict
  Detected d;
  // The rank's verdict is an Incident: its culprit and rule go to the failure, the rest
  // (what was corrupt, how it was found, the verified step) is what was found.
  if (!d.found.ParseFromString(*verdict)) return std::nullopt;
  d.failure.kind = policy::FailureKind::kSdc;
  d.failure.culprit = d.found.rank();
  d.failure.rule = d.found.rule();
  d.failure.restore_at_most = d.found.verified_step();
  d.found.clear_rank();
  d.found.clear_rule();
  d.found.set_detected_at(recovery::unix_now());
  d.found.set_slot(d.failure.culprit >= 0 ? ctx_.host->slot_of(d.failure.culprit) : -1);
  for (const InjectionRecord& in : FaultInjector::read_injections(*ctx_.store))
    if (in.kind == "sdc" && in.rank == d.failure.culprit) d.found.set_injected_at(in.time);
  LOG(WARNING) << "silent data corruption: " << d.found.detail();
  return d;
}

void Detector::label_slot_loss(Detected* d, const RankExit& ex) {
  const int slot = ex.slot;
  report::Incident* inc = &d->found;
  d->failure.lost_slots.insert(slot);
  for (int r : ctx_.host->ranks_on(slot)) d->failure.dead.insert(r);
  if (inc->kind() != "slot_loss" && inc->kind() != "comm_error") return;
  // The peers' communication errors were only the first sign of it.
  if (inc->kind() == "comm_error") inc->set_detail(detail::concat("slot ", slot, " lost"));
  inc->set_kind("slot_loss");
  inc->set_slot(slot);
  d->failure.rule = ex.lost_by;
  d->failure.kind = policy::FailureKind::kSlotLoss;
  // An injection names one loss: one that an incident already named (the same machine lost
  // again later, repaired and back, or in a takeover's wait) is not this loss's.
  std::set<double> named;
  if (auto recorded = ctx_.store->try_get_prefix(keys::kIncidentPrefix))
    for (const auto& [key, value] : *recorded) {
      report::Incident earlier;
      if (key != keys::kIncidentCount && earlier.ParseFromString(value) &&
          earlier.injected_at() > 0)
        named.insert(earlier.injected_at());
    }
  for (const InjectionRecord& in : FaultInjector::read_injections(*ctx_.store))
    if ((in.kind == "partition" || in.kind == "slot_loss") && ctx_.host->slot_of(in.rank) == slot &&
        in.time <= recovery::unix_now() && !named.count(in.time)) {
      // The injection names the rank whose machine it took: the slot's ranks are all dead,
      // and the policy evicts the slot whichever of them it names.
      inc->set_kind(in.kind);
      d->failure.culprit = in.rank;
      inc->set_injected_at(in.time);
      if (in.kind == "partition") d->failure.kind = policy::FailureKind::kPartition;
    }
  const double now = recovery::unix_now();
  LOG(WARNING) << "slot " << slot << " lost (" << inc->kind() << ")"
               << (inc->injected_at() > 0
                       ? detail::concat(" ", now - inc->injected_at(), " s after the injection")
                       : "");
  ctx_.event("slot_lost", EventFields()
                              .add("slot", slot)
                              .add("kind", inc->kind())
                              .add("after_injection_s",
                                   inc->injected_at() > 0 ? now - inc->injected_at() : -1.0));
}

void Detector::fold_exit(Detected* d, const RankExit& ex) {
  report::Incident* inc = &d->found;
  d->failure.dead.insert(ex.rank);
  // A peer's communication error was seen before this exit: the exit names the culprit.
  if (inc->kind() == "comm_error" && !ex.slot_lost && !ex.clean()) {
    inc->set_slot(ctx_.host->slot_of(ex.rank));
    inc->set_kind(WIFSIGNALED(ex.status) ? "crash" : "exit");
    d->failure.rule = "exit";
    d->failure.kind =
        WIFSIGNALED(ex.status) ? policy::FailureKind::kCrash : policy::FailureKind::kExit;
    d->failure.culprit = ex.rank;
  }
  if (ex.slot_lost && !d->failure.lost_slots.count(ex.slot)) label_slot_loss(d, ex);
  inc->set_detail(inc->detail() + detail::concat("; rank ", ex.rank, " ", ex.describe()));
}

void Detector::fold_unanswered(Detected* d, int rank, int64_t ms) {
  report::Incident* inc = &d->found;
  ctx_.host->kill(rank);
  d->failure.dead.insert(rank);
  if (d->failure.culprit < 0 || inc->kind() == "comm_error") {
    inc->set_slot(ctx_.host->slot_of(rank));
    inc->set_kind("hang");
    d->failure.rule = "abort_deadline";
    d->failure.kind = policy::FailureKind::kHang;
    d->failure.culprit = rank;
  }
  inc->set_detail(inc->detail() + detail::concat("; rank ", rank,
                                                 " did not answer the abort within ", ms,
                                                 " ms (hung): killed"));
}

std::optional<Detected> Detector::hang(int incident) {
  const auto& dc = ctx_.cfg().detect();
  if (!watch_progress_ || progress_.empty()) return std::nullopt;
  const auto now = Clock::now();
  if (now < next_hang_check_) return std::nullopt;
  next_hang_check_ = now + kHangCheckEvery;
  const int world = ctx_.members->world();
  int64_t min_step = INT64_MAX;
  Clock::time_point oldest = now;
  for (const auto& [r, p] : progress_) {
    min_step = std::min(min_step, p.first.step());
    oldest = std::min(oldest, p.second);
  }
  if (int(progress_.size()) < world) min_step = std::min<int64_t>(min_step, epoch_start_step_);
  if (min_step != last_min_step_) {
    last_min_step_ = min_step;
    last_advance_ = now;
  }
  const double stalled_s = std::chrono::duration<double>(now - last_advance_).count();
  if (!hang_possible(std::chrono::duration<double>(now - oldest).count(), stalled_s,
                     dc.liveness_timeout_ms() / 1000.0, dc.hang_grace_ms() / 1000.0))
    return std::nullopt;
  HangSnapshot snap;
  snap.topology = ctx_.members->topo();
  snap.ranks.resize(size_t(world));
  for (const auto& [r, p] : progress_) {
    HangSnapshot::Rank& hr = snap.ranks[size_t(r)];
    hr.reported = true;
    hr.last = p.first;
    hr.age_s = std::chrono::duration<double>(now - p.second).count();
    const int slot = ctx_.host->slot_of(r);
    hr.agent_alive = slot < 0 || ctx_.host->slot_silence_s(slot) < kAgentSilentS;
  }
  snap.epoch_start_step = epoch_start_step_;
  snap.steps = ctx_.cfg().train().steps();
  snap.stalled_s = stalled_s;
  snap.median_step_s = median_step_s();
  snap.liveness_timeout_s = dc.liveness_timeout_ms() / 1000.0;
  snap.hang_grace_s = dc.hang_grace_ms() / 1000.0;
  HangVerdict v = find_hang(snap);
  if (v.culprits.empty() && v.capture_stacks && stacks_for_stall_ != last_advance_) {
    // No cheap rule names a culprit: the workers' stacks, once per stall.
    stacks_for_stall_ = last_advance_;
    const control::StacksReply sr =
        ctx_.capture_stacks(detail::concat("incident", incident, "-epoch", ctx_.members->epoch()));
    LOG(WARNING) << "the job stalled and no rule names a culprit: stacks in " << sr.dir() << ": "
                 << sr.message();
    if (sr.ok() && sr.culprits_size() > 0) {
      v.culprits.assign(sr.culprits().begin(), sr.culprits().end());
      v.rule = HangRule::kNone;
      v.detail = sr.message() + " (stacks in " + sr.dir() + ")";
    }
  }
  if (v.culprits.empty()) return std::nullopt;
  Detected d;
  d.found.set_detected_at(recovery::unix_now());
  d.found.set_slot(ctx_.host->slot_of(v.culprits.front()));
  d.found.set_kind("hang");
  d.found.set_detail(v.detail);
  d.failure.kind = policy::FailureKind::kHang;
  d.failure.culprit = v.culprits.front();
  d.failure.rule = v.rule == HangRule::kNone ? "stacks" : hang_rule_name(v.rule);
  // A hung worker cannot be interrupted from its own threads: it is killed now.
  for (int r : v.culprits) {
    ctx_.host->kill(r);
    d.failure.dead.insert(r);
  }
  LOG(WARNING) << "hang found (" << d.failure.rule << "): " << v.detail;
  return d;
}

}  // namespace keel
