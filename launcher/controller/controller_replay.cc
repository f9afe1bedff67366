// The stop-time dual-phase replay (robust/sdc_replay.h decides the groups and reads the
// results): with every training worker parked in the recovery wait (their backup servers
// still serve their snapshots), each group of machines runs one whole TP×PP pipeline of fresh
// replay workers (launcher/worker/replay_worker.h) that load the same step, train one step and
// publish a digest; contiguous groups first, then strided.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "launcher/controller/controller_impl.h"
#include "robust/sdc_replay.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// Ids of replay workers on their slots: far above any rank of the job.
constexpr int kReplayIdBase = 1 << 24;

}  // namespace

bool Controller::Impl::replay_possible(std::string* why) const {
  if (!o.cfg.sdc().replay()) {
    *why = "sdc.replay is off";
    return false;
  }
  if (o.cfg.parallel().zero1() && topo.dp() > 1) {
    *why = "a replay at data parallelism 1 needs whole moments, and ZeRO-1 shards them";
    return false;
  }
  return true;
}

std::vector<int> Controller::Impl::replay(int64_t step, std::string* detail) {
  std::string why;
  if (!replay_possible(&why)) {
    *detail = "no replay: " + why;
    return {};
  }
  const policy::ClusterView v = view();
  std::vector<int> machines;
  for (const auto& [slot, st] : v.slots)
    if ((st == membership::SlotInfo::active && !v.ranks_on(slot).empty()) ||
        v.ready_standbys.count(slot))
      machines.push_back(slot);
  const int ranks = topo.tp() * topo.pp();
  const sdc::ReplayPlan plan = sdc::plan_replay(machines, ranks, std::max(1, v.workers_per_slot));
  if (!plan.why_not.empty()) {
    *detail = "no replay: " + plan.why_not;
    return {};
  }
  static const char* kPhase[] = {"contiguous", "strided"};
  std::vector<std::set<int>> failing;
  std::string text = detail::concat("replay of step ", step + 1, " from step ", step, ":");
  for (size_t ph = 0; ph < plan.phases.size(); ++ph) {
    const auto& groups = plan.phases[ph];
    std::vector<std::string> keys;
    std::vector<std::pair<int, int>> started;  // (slot, id)
    for (size_t g = 0; g < groups.size(); ++g) {
      keys.push_back(detail::concat("replay/", incidents, "/", ph, "/", g));
      for (int k = 0; k < ranks; ++k) {
        const int slot = groups[g][size_t(k / std::max(1, v.workers_per_slot))];
        const int id = kReplayIdBase + int(ph) * 65536 + int(g) * 256 + k;
        std::map<std::string, std::string> env = rank_env(k, /*restarted=*/false);
        env["KEEL_WORLD_SIZE"] = std::to_string(ranks);
        env["KEEL_REPLAY"] = detail::concat(keys.back(), ":", step, ":", epoch, ":", topo.dp());
        env.erase("KEEL_CONTROLLER");  // it reports nothing: its answer is in the store
        if (host->spawn_extra(slot, id, env)) started.emplace_back(slot, id);
      }
    }
    event("replay_phase", EventFields().add("phase", kPhase[ph]).add("groups", int(groups.size())));
    // Every group answers with a digest or an error; a group that does neither in time
    // counts as differing.
    std::vector<std::string> digests(groups.size());
    std::vector<bool> done(groups.size(), false);
    const auto deadline = Clock::now() + std::chrono::milliseconds(o.cfg.sdc().replay_timeout_ms());
    while (std::count(done.begin(), done.end(), true) < int(groups.size()) &&
           Clock::now() < deadline) {
      pump();
      for (size_t g = 0; g < groups.size(); ++g) {
        if (done[g]) continue;
        for (const char* what : {"/digest", "/error"}) {
          try {
            const std::string val = store->get(keys[g] + what, std::chrono::milliseconds(1));
            done[g] = true;
            if (std::string(what) == "/digest")
              digests[g] = val;
            else
              LOG(WARNING) << "replay group " << g << " (" << kPhase[ph] << "): " << val;
          } catch (const CommTimeout&) {
          }
          if (done[g]) break;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (const auto& [slot, id] : started) host->kill_extra(slot, id);
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

Controller::Impl::Detected Controller::Impl::requested_replay() {
  Detected d;
  d.inc.set_detected_at(unix_now());
  d.inc.set_kind("sdc");
  d.inc.set_rank(-1);
  d.inc.set_slot(-1);
  d.inc.set_rule("sdc_replay_requested");
  d.inc.set_detail("keel-ctl replay");
  d.failure.kind = policy::FailureKind::kSdc;
  d.failure.rule = d.inc.rule();
  // With the checks on, nothing after the newest verified step is trusted; with them off
  // nothing is known verified, and the job goes on from its newest step.
  if (o.cfg.sdc().check_every_steps() > 0) {
    try {
      const int64_t v =
          std::stoll(store->get(keys::kSdcVerified, std::chrono::milliseconds(1)));
      d.failure.restore_at_most = v;
      d.inc.set_verified_step(int(v));
      d.inc.set_first_bad_step(int(v + 1));
    } catch (const std::exception&) {
    }
  }
  return d;
}

void Controller::Impl::pin_by_replay(Detected* d, const std::map<int, policy::Holdings>& have) {
  // The step to replay: the newest verified one, else the newest every rank can restore.
  int64_t step = -1;
  if (d->failure.restore_at_most) {
    step = *d->failure.restore_at_most;
  } else {
    std::map<int, policy::Holdings> snapshots = have;
    for (auto& [r, h] : snapshots) h.live.reset();  // a replay loads a snapshot
    step = policy::restore_point(snapshots, world, -1, false).step;
  }
  std::string detail;
  const std::vector<int> machines = step >= 0 ? replay(step, &detail) : std::vector<int>{};
  if (step < 0) detail = "no replay: no snapshot every rank holds";
  LOG(WARNING) << detail;
  d->inc.set_detail(d->inc.detail() + "; " + detail);
  event("replay", EventFields().add("detail", detail));
  for (int slot : machines) {
    const std::vector<int> ranks = host->ranks_on(slot);
    if (ranks.empty()) continue;  // a standby: it holds no rank to move
    // The replay names a machine, not a rank: the policy evicts the slot of any of its ranks.
    d->failure.culprit = ranks.front();
    d->inc.set_rank(-1);
    d->inc.set_slot(slot);
    d->inc.set_found_by("replay");
    d->inc.set_rule("sdc_replay");
    return;
  }
}

}  // namespace keel
