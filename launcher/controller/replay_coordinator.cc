#include "launcher/controller/replay_coordinator.h"

#include <algorithm>
#include <thread>

#include "launcher/job_env.h"
#include "launcher/recovery_protocol.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/sdc_replay.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// Ids of replay workers on their slots: far above any rank of the job.
constexpr int kReplayIdBase = 1 << 24;
// Between looks at the groups' answers.
constexpr std::chrono::milliseconds kPollPause{5};
const char* const kPhase[] = {"contiguous", "strided"};

}  // namespace

bool ReplayCoordinator::possible(std::string* why) const {
  if (!ctx_.cfg().sdc().replay()) {
    *why = "sdc.replay is off";
    return false;
  }
  if (ctx_.cfg().parallel().zero1() && ctx_.members->topo().dp() > 1) {
    *why = "a replay at data parallelism 1 needs whole moments, and ZeRO-1 shards them";
    return false;
  }
  // Enough machines for three groups, asked now: keel-ctl replay is refused before any rank
  // is aborted for a replay that cannot run.
  const sdc::ReplayPlan plan = plan_now();
  if (!plan.why_not.empty()) {
    *why = plan.why_not;
    return false;
  }
  return true;
}

std::vector<int> ReplayCoordinator::replay_machines() const {
  ctx_.host->refresh();
  const policy::ClusterView v = ctx_.members->view();
  std::vector<int> out;
  for (const auto& [slot, st] : v.slots)
    if ((st == membership::SlotInfo::active && !v.ranks_on(slot).empty()) ||
        v.ready_standbys.count(slot))
      out.push_back(slot);
  return out;
}

sdc::ReplayPlan ReplayCoordinator::plan_now() const {
  const Topology& topo = ctx_.members->topo();
  return sdc::plan_replay(replay_machines(), topo.tp() * topo.pp(),
                          std::max(1, ctx_.members->view().workers_per_slot));
}

std::vector<std::string> ReplayCoordinator::run_phase(int phase,
                                                      const std::vector<std::vector<int>>& groups,
                                                      const store::ReplayTask& task, int incident,
                                                      int ranks, int per_slot) {
  std::vector<std::string> group_keys;
  std::vector<std::pair<int, int>> started;  // (slot, id)
  for (size_t g = 0; g < groups.size(); ++g) {
    group_keys.push_back(keys::replay_key(incident, phase, int(g)));
    set_message(*ctx_.store, keys::replay_task_key(group_keys.back()), task);
    for (int k = 0; k < ranks; ++k) {
      const int slot = groups[g][size_t(k / per_slot)];
      const int id = kReplayIdBase + phase * 65536 + int(g) * 256 + k;
      std::map<std::string, std::string> env = ctx_.stand_in_env(k, ranks);
      env[env::kReplay] = group_keys.back();
      if (ctx_.host->spawn_extra(slot, id, env)) started.emplace_back(slot, id);
    }
  }
  ctx_.event("replay_phase",
             EventFields().add("phase", kPhase[phase]).add("groups", int(groups.size())));
  // Every group answers with a digest or an error; a group that does neither in time
  // counts as differing.
  std::vector<std::string> digests(groups.size());
  std::vector<bool> done(groups.size(), false);
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(ctx_.cfg().sdc().replay_timeout_ms());
  while (std::count(done.begin(), done.end(), true) < int(groups.size()) &&
         Clock::now() < deadline) {
    ctx_.pump_once();
    for (size_t g = 0; g < groups.size(); ++g) {
      if (done[g]) continue;
      const auto r =
          try_get_message<store::ReplayResult>(*ctx_.store, keys::replay_result_key(group_keys[g]));
      if (!r) continue;
      done[g] = true;
      if (r->error().empty())
        digests[g] = r->digest();
      else
        LOG(WARNING) << "replay group " << g << " (" << kPhase[phase] << "): " << r->error();
    }
    std::this_thread::sleep_for(kPollPause);
  }
  for (const auto& [slot, id] : started) ctx_.host->kill_extra(slot, id);
  return digests;
}

std::vector<int> ReplayCoordinator::replay(int64_t step, int incident, std::string* detail) {
  std::string why;
  if (!possible(&why)) {
    *detail = "no replay: " + why;
    return {};
  }
  const Topology& topo = ctx_.members->topo();
  const int ranks = topo.tp() * topo.pp();
  const int per_slot = std::max(1, ctx_.members->view().workers_per_slot);
  const sdc::ReplayPlan plan = plan_now();
  if (!plan.why_not.empty()) {
    *detail = "no replay: " + plan.why_not;
    return {};
  }
  store::ReplayTask task;
  task.set_step(step);
  task.set_epoch(ctx_.members->epoch());
  task.set_source_dp(topo.dp());
  std::vector<std::set<int>> failing;
  std::string text = detail::concat("replay of step ", step + 1, " from step ", step, ":");
  for (size_t ph = 0; ph < plan.phases.size(); ++ph) {
    const auto& groups = plan.phases[ph];
    const std::vector<std::string> digests =
        run_phase(int(ph), groups, task, incident, ranks, per_slot);
    const std::optional<std::set<int>> f = sdc::failing_groups(digests);
    std::string groups_text;
    for (size_t g = 0; g < groups.size(); ++g) {
      groups_text += detail::concat(g ? ", " : "", "{");
      for (size_t m = 0; m < groups[g].size(); ++m)
        groups_text += detail::concat(m ? " " : "", "slot ", groups[g][m]);
      groups_text += f && f->count(int(g)) ? "} differs" : "}";
    }
    text += detail::concat(" ", kPhase[ph], " groups ", groups_text, ";");
    if (!f) {
      *detail = text + " no digest held by most groups: no culprit";
      return {};
    }
    failing.push_back(*f);
  }
  std::vector<int> culprits = sdc::replay_culprits(plan, failing);
  if (culprits.empty()) {
    *detail = text + " no machine failed in both phases";
  } else {
    std::string m;
    for (int s : culprits) m += detail::concat(m.empty() ? "" : ", ", s);
    *detail = text + " the machine in a failing group of both: slot " + m;
  }
  return culprits;
}

Detected ReplayCoordinator::requested() const {
  Detected d;
  d.found.set_detected_at(recovery::unix_now());
  d.found.set_kind("sdc");
  d.found.set_slot(-1);
  d.found.set_detail("keel-ctl replay");
  d.failure.kind = policy::FailureKind::kSdc;
  d.failure.rule = kRequestedRule;
  // With the checks on, nothing after the newest verified step is trusted; with them off
  // nothing is known verified, and the job goes on from its newest step.
  if (ctx_.cfg().sdc().check_every_steps() > 0) {
    if (auto v = try_get_message<store::Step>(*ctx_.store, keys::kSdcVerified)) {
      d.failure.restore_at_most = v->step();
      d.found.set_verified_step(int(v->step()));
      d.found.set_first_bad_step(int(v->step() + 1));
    }
  }
  return d;
}

void ReplayCoordinator::pin(Detected* d, const std::map<int, policy::Holdings>& have,
                            int incident) {
  // The step to replay: the newest verified one, else the newest every rank can restore.
  int64_t step = -1;
  if (d->failure.restore_at_most) {
    step = *d->failure.restore_at_most;
  } else {
    std::map<int, policy::Holdings> snapshots = have;
    for (auto& [r, h] : snapshots) h.live.reset();  // a replay loads a snapshot
    step = policy::restore_point(snapshots, ctx_.members->world(), -1, false).step;
  }
  std::string detail;
  const std::vector<int> machines =
      step >= 0 ? replay(step, incident, &detail) : std::vector<int>{};
  if (step < 0) detail = "no replay: no snapshot every rank holds";
  LOG(WARNING) << detail;
  d->found.set_detail(d->found.detail() + "; " + detail);
  ctx_.event("replay", EventFields().add("detail", detail));
  for (int slot : machines) {
    const std::vector<int> ranks = ctx_.host->ranks_on(slot);
    if (ranks.empty()) continue;  // a standby: it holds no rank to move
    // The replay names a machine, not a rank: the policy evicts the slot of any of its ranks.
    d->failure.culprit = ranks.front();
    d->failure.culprit_is_machine = true;
    d->failure.rule = "sdc_replay";
    d->found.set_slot(slot);
    d->found.set_found_by("replay");
    return;
  }
  // An operator's replay that found nothing clears the job: no rollback, no incident.
  if (step >= 0 && d->failure.rule == kRequestedRule) {
    d->failure.replay_cleared = true;
    d->failure.restore_at_most.reset();
  }
}

}  // namespace keel
