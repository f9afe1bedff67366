#include "launcher/controller/slow_watcher.h"

#include "launcher/recovery_protocol.h"
#include "robust/fault_injector.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {

void SlowWatcher::on_round(int rank, const control::RoundStats& round) {
  // A report carries its rank's newest round until the next one: each is judged once.
  if (ctx_.cfg().detect().slow_round_steps() <= 0 || round.steps() <= 0 ||
      round.round() <= judged_round_)
    return;
  rounds_[round.round()][rank] = round;
}

void SlowWatcher::reset() {
  rounds_.clear();
  judged_round_ = -1;
  warned_.clear();
  detector_.reset();
  slowest_rank_ = -1;
}

void SlowWatcher::record(const report::Incident& inc) {
  store_incident(ctx_, inc);
  ctx_.event("incident", EventFields()
                             .add("kind", inc.kind())
                             .add("rank", inc.rank())
                             .add("action", inc.action())
                             .add("detail", inc.detail()));
}

std::optional<Detected> SlowWatcher::judge() {
  // The oldest round every rank has sent; older partial ones will never complete (a rank's
  // report carries only its newest round).
  const int world = ctx_.members->world();
  auto full = rounds_.end();
  for (auto it = rounds_.begin(); it != rounds_.end(); ++it)
    if (int(it->second.size()) == world) full = it;
  if (full == rounds_.end()) return std::nullopt;
  const int64_t round = full->first;
  judged_round_ = round;
  const SlowVerdict v = detector_.observe(ctx_.members->topo(), full->second);
  rounds_.erase(rounds_.begin(), std::next(full));
  slowest_rank_ = v.slowest;
  slowest_factor_ = v.slowest_factor;
  if (v.kind == SlowVerdict::Kind::kNone) return std::nullopt;

  const int64_t step = round * ctx_.cfg().detect().slow_round_steps();
  // A warning is recorded here, whole; an eviction goes through the epoch transition, whose
  // incident is derived from `found`, the failure and the plan.
  Detected d;
  report::Incident& inc = d.found;
  inc.set_kind(slow_kind_name(v.kind));
  inc.set_slot(v.rank >= 0 ? ctx_.host->slot_of(v.rank) : -1);
  inc.set_detected_at(recovery::unix_now());
  inc.set_detail(v.detail);
  inc.set_slow_factor(v.factor);
  inc.set_slow_figures(v.figures);
  for (const InjectionRecord& in : FaultInjector::read_injections(*ctx_.store))
    if ((in.kind == "slow" || in.kind == "slow_link") && in.rank == v.rank)
      inc.set_injected_at(in.time);
  LOG(WARNING) << "fail-slow: " << v.detail << " (" << v.figures << ")";

  // A warning's own record: the failure it would have been, at the round's step.
  auto warning = [&](const std::string& action, int ladder_rung, const std::string& why) {
    report::Incident w = inc;
    w.set_rank(v.rank);
    w.set_rule("fail_slow");
    w.set_step(int(step));
    w.set_epoch(ctx_.members->epoch());
    w.set_action(action);
    w.set_rung("warn");
    w.set_ladder_rung(ladder_rung);
    w.set_why(why);
    record(w);
  };
  if (v.kind == SlowVerdict::Kind::kMfuDecline) {
    warning("warn: the whole job slowed down; no rank or link explains it", 0,
            "a decline with no degrader: nothing to evict");
    return std::nullopt;
  }
  ctx_.host->refresh();
  const policy::SlowAction a =
      decide_slow(v.rank, ctx_.members->view(), ctx_.policy_options(/*with_checkpoint=*/false));
  if (!a.evict) {
    detector_.forget(v.rank);
    // Named once per epoch: a warning every few rounds would bury the incident log. It is
    // still judged: once a standby is ready, it is swapped.
    if (!warned_.insert(v.rank).second) return std::nullopt;
    LOG(WARNING) << "rank " << v.rank << " stays: " << a.why;
    warning(detail::concat("warn: rank ", v.rank, " is slow; training goes on"), 1, a.why);
    return std::nullopt;
  }
  d.failure.kind = policy::FailureKind::kSlow;
  d.failure.culprit = v.rank;
  d.failure.rule = "fail_slow";
  return d;
}

}  // namespace keel
