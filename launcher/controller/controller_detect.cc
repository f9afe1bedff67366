// What the controller counts as a failure, cheapest signal first: a worker's exit (its
// agent reports it within 20 ms), a slot whose heartbeats stopped, a communication error a
// rank reported, and hangs (robust/hang_rules.h: reports that stopped, collective sequence
// numbers, and when neither names a culprit, the workers' stacks).
#include <algorithm>
#include <cstdio>

#include "launcher/controller/controller_impl.h"
#include "robust/fault_injector.h"
#include "robust/hang_rules.h"
#include "runtime/logging.h"

namespace keel {

Controller::Impl::Detected Controller::Impl::from_exit(const RankExit& ex) {
  Detected d;
  d.inc.set_detected_at(unix_now());
  d.inc.set_rank(ex.rank);
  d.inc.set_slot(host->slot_of(ex.rank));
  d.inc.set_kind(ex.slot_lost ? "slot_loss" : WIFSIGNALED(ex.status) ? "crash" : "exit");
  d.inc.set_detail(detail::concat("rank ", ex.rank, " ", ex.describe()));
  d.inc.set_rule(ex.slot_lost ? "heartbeat" : "exit");
  d.failure.kind = ex.slot_lost             ? policy::FailureKind::kSlotLoss
                   : WIFSIGNALED(ex.status) ? policy::FailureKind::kCrash
                                            : policy::FailureKind::kExit;
  d.failure.culprit = ex.rank;
  d.failure.dead.insert(ex.rank);
  d.failure.rule = d.inc.rule();
  if (ex.slot_lost) {
    d.failure.lost_slots.insert(ex.slot);
    for (int r : host->ranks_on(ex.slot)) d.failure.dead.insert(r);
    label_slot_loss(&d, ex.slot);
  }
  return d;
}

std::optional<Controller::Impl::Detected> Controller::Impl::comm_error() {
  if (store->add(keys::errors_key(epoch), 0) <= 0) return std::nullopt;
  if (auto d = sdc()) return d;
  Detected d;
  // New code on probation broke the training: the ranks said why.
  try {
    const std::string why =
        store->get(keys::update_failure_key(epoch), std::chrono::milliseconds(1));
    d.inc.set_detected_at(unix_now());
    d.inc.set_rank(-1);
    d.inc.set_slot(-1);
    d.inc.set_kind("update_failure");
    d.inc.set_detail(why);
    d.inc.set_rule("probation");
    d.failure.kind = policy::FailureKind::kCommError;
    d.failure.rule = "probation";
    return d;
  } catch (const CommTimeout&) {
  }
  d.inc.set_detected_at(unix_now());
  d.inc.set_rank(-1);
  d.inc.set_slot(-1);
  d.inc.set_kind("comm_error");
  d.inc.set_detail("a communication error");
  d.inc.set_rule("comm_error");
  d.failure.kind = policy::FailureKind::kCommError;
  d.failure.rule = "comm_error";
  return d;
}

std::optional<Controller::Impl::Detected> Controller::Impl::sdc() {
  std::string verdict;
  try {
    verdict = store->get(keys::sdc_verdict_key(epoch), std::chrono::milliseconds(1));
  } catch (const CommTimeout&) {
    return std::nullopt;  // the ranks' error is not an SDC verdict
  }
  Detected d;
  if (!d.inc.ParseFromString(verdict)) return std::nullopt;
  d.inc.set_detected_at(unix_now());
  d.inc.set_slot(d.inc.rank() >= 0 ? host->slot_of(d.inc.rank()) : -1);
  d.failure.kind = policy::FailureKind::kSdc;
  d.failure.culprit = d.inc.rank();
  d.failure.rule = d.inc.rule();
  d.failure.restore_at_most = d.inc.verified_step();
  for (const InjectionRecord& in : FaultInjector::read_injections(*store))
    if (in.kind == "sdc" && in.rank == d.inc.rank()) d.inc.set_injected_at(in.time);
  LOG(WARNING) << "silent data corruption: " << d.inc.detail();
  return d;
}

void Controller::Impl::label_slot_loss(Detected* d, int slot) {
  report::Incident* inc = &d->inc;
  d->failure.lost_slots.insert(slot);
  for (int r : host->ranks_on(slot)) d->failure.dead.insert(r);
  if (inc->kind() != "slot_loss" && inc->kind() != "comm_error") return;
  // The peers' communication errors were only the first sign of it.
  if (inc->kind() == "comm_error") inc->set_detail(detail::concat("slot ", slot, " lost"));
  inc->set_kind("slot_loss");
  inc->set_slot(slot);
  inc->set_rule("heartbeat");
  d->failure.kind = policy::FailureKind::kSlotLoss;
  for (const InjectionRecord& in : FaultInjector::read_injections(*store))
    if ((in.kind == "partition" || in.kind == "slot_loss") && host->slot_of(in.rank) == slot &&
        in.time <= unix_now()) {
      inc->set_kind(in.kind);
      inc->set_rank(in.rank);
      inc->set_injected_at(in.time);
      if (in.kind == "partition") d->failure.kind = policy::FailureKind::kPartition;
    }
  const double now = unix_now();
  LOG(WARNING) << "slot " << slot << " lost (" << inc->kind() << ")"
               << (inc->injected_at() > 0
                       ? detail::concat(" ", now - inc->injected_at(), " s after the injection")
                       : "");
  event("slot_lost",
        EventFields()
            .add("slot", slot)
            .add("kind", inc->kind())
            .add("after_injection_s", inc->injected_at() > 0 ? now - inc->injected_at() : -1.0));
}

double Controller::Impl::median_step_s() const {
  std::vector<double> step_s;
  for (const auto& [r, p] : progress)
    if (p.first.step_s() > 0) step_s.push_back(p.first.step_s());
  if (step_s.empty()) return 0;
  std::nth_element(step_s.begin(), step_s.begin() + long(step_s.size() / 2), step_s.end());
  return step_s[step_s.size() / 2];
}

std::optional<Controller::Impl::Detected> Controller::Impl::hang() {
  const auto& dc = o.cfg.detect();
  if (!server || progress.empty()) return std::nullopt;
  const auto now = Clock::now();
  HangSnapshot snap;
  snap.topology = topo;
  snap.ranks.resize(size_t(world));
  int64_t min_step = INT64_MAX;
  for (const auto& [r, p] : progress) {
    HangSnapshot::Rank& hr = snap.ranks[size_t(r)];
    hr.reported = true;
    hr.last = p.first;
    hr.age_s = std::chrono::duration<double>(now - p.second).count();
    const int slot = host->slot_of(r);
    // Heartbeats come every 200 ms: an agent silent for longer may be dying with its slot.
    hr.agent_alive = slot < 0 || host->slot_silence_s(slot) < 0.6;
    min_step = std::min(min_step, p.first.step());
  }
  if (int(progress.size()) < world) min_step = std::min<int64_t>(min_step, epoch_start_step);
  if (min_step != last_min_step) {
    last_min_step = min_step;
    last_advance = now;
  }
  snap.epoch_start_step = epoch_start_step;
  snap.steps = o.cfg.train().steps();
  snap.stalled_s = std::chrono::duration<double>(now - last_advance).count();
  snap.median_step_s = median_step_s();
  snap.liveness_timeout_s = dc.liveness_timeout_ms() / 1000.0;
  snap.hang_grace_s = dc.hang_grace_ms() / 1000.0;
  HangVerdict v = find_hang(snap);
  if (v.culprits.empty() && v.capture_stacks && stacks_for_stall != last_advance) {
    // No cheap rule names a culprit: the workers' stacks, once per stall.
    stacks_for_stall = last_advance;
    const control::StacksReply sr =
        capture_stacks(detail::concat("incident", incidents + 1, "-epoch", epoch));
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
  d.inc.set_detected_at(unix_now());
  d.inc.set_rank(v.culprits.front());
  d.inc.set_slot(host->slot_of(v.culprits.front()));
  d.inc.set_kind("hang");
  d.inc.set_rule(v.rule == HangRule::kNone ? "stacks" : hang_rule_name(v.rule));
  d.inc.set_detail(v.detail);
  d.failure.kind = policy::FailureKind::kHang;
  d.failure.culprit = v.culprits.front();
  d.failure.rule = d.inc.rule();
  // A hung worker cannot be interrupted from its own threads: it is killed now.
  for (int r : v.culprits) {
    host->kill(r);
    d.failure.dead.insert(r);
  }
  LOG(WARNING) << "hang found (" << d.inc.rule() << "): " << v.detail;
  return d;
}

}  // namespace keel
