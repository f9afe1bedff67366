// Fail-slow (robust/slow_rules.h decides): every rank's round of figures arrives with its
// progress reports; once every rank of the membership sent round k, the detector judges it.
// A degrader is swapped for a warm standby through the usual epoch transition, or, where
// robust/recovery_policy.h's decide_slow says it cannot or should not be, named in an
// incident while the job goes on; so is a decline of the whole job that no rank explains.
#include <cstdio>

#include "launcher/controller/controller_impl.h"
#include "robust/fault_injector.h"
#include "runtime/logging.h"

namespace keel {

void Controller::Impl::on_round(int rank, const control::RoundStats& round) {
  // A report carries its rank's newest round until the next one: each is judged once.
  if (o.cfg.detect().slow_round_steps() <= 0 || round.steps() <= 0 || round.round() <= judged_round)
    return;
  auto& ranks = rounds[round.round()];
  ranks[rank] = round;
}

void Controller::Impl::record_incident(report::Incident inc) {
  const int64_t n = store->add(keys::kIncidentCount, 1) - 1;
  store->set(keys::incident_key(n), inc.SerializeAsString());
  event("incident", EventFields()
                        .add("kind", inc.kind())
                        .add("rank", inc.rank())
                        .add("action", inc.action())
                        .add("detail", inc.detail()));
}

std::optional<Controller::Impl::Detected> Controller::Impl::fail_slow() {
  // The oldest round every rank has sent; older partial ones will never complete (a rank's
  // report carries only its newest round).
  auto full = rounds.end();
  for (auto it = rounds.begin(); it != rounds.end(); ++it)
    if (int(it->second.size()) == world) full = it;
  if (full == rounds.end()) return std::nullopt;
  const int64_t round = full->first;
  judged_round = round;
  const SlowVerdict v = slow_detector.observe(topo, full->second);
  rounds.erase(rounds.begin(), std::next(full));
  slowest_rank = v.slowest;
  slowest_factor = v.slowest_factor;
  if (v.kind == SlowVerdict::Kind::kNone) return std::nullopt;

  const int64_t step = round * o.cfg.detect().slow_round_steps();
  Detected d;
  report::Incident& inc = d.inc;
  inc.set_kind(slow_kind_name(v.kind));
  inc.set_rank(v.rank);
  inc.set_slot(v.rank >= 0 ? host->slot_of(v.rank) : -1);
  inc.set_step(int(step));
  inc.set_detected_at(unix_now());
  inc.set_rule("fail_slow");
  inc.set_detail(v.detail);
  inc.set_slow_factor(v.factor);
  inc.set_slow_figures(v.figures);
  inc.set_epoch(epoch);
  for (const InjectionRecord& in : FaultInjector::read_injections(*store))
    if ((in.kind == "slow" || in.kind == "slow_link") && in.rank == v.rank)
      inc.set_injected_at(in.time);
  LOG(WARNING) << "fail-slow: " << v.detail << " (" << v.figures << ")";

  if (v.kind == SlowVerdict::Kind::kMfuDecline) {
    inc.set_action("warn: the whole job slowed down; no rank or link explains it");
    inc.set_rung("warn");
    inc.set_why("a decline with no degrader: nothing to evict");
    record_incident(inc);
    return std::nullopt;
  }
  const policy::SlowAction a = decide_slow(v.rank, view(), policy_options(false));
  if (!a.evict) {
    slow_detector.forget(v.rank);
    // Named once per epoch: a warning every few rounds would bury the incident log. It is
    // still judged: once a standby is ready, it is swapped.
    if (!warned_slow.insert(v.rank).second) return std::nullopt;
    inc.set_action(detail::concat("warn: rank ", v.rank, " is slow; training goes on"));
    inc.set_rung("warn");
    inc.set_ladder_rung(1);
    inc.set_why(a.why);
    LOG(WARNING) << "rank " << v.rank << " stays: " << a.why;
    record_incident(inc);
    return std::nullopt;
  }
  d.failure.kind = policy::FailureKind::kSlow;
  d.failure.culprit = v.rank;
  d.failure.rule = "fail_slow";
  return d;
}

}  // namespace keel
