// Stop-time diagnostics (robust/diagnostics.h judges them): with every training worker parked
// in the recovery wait, one fresh process (launcher/worker/diagnose_worker.h) stands in for each rank
// of the suspect slots and for every peer of their TP, PP and DP groups, on that rank's slot.
// They check the device, the golden mini-GPT and each group's links in parallel, answer
// through the store, and whatever has not answered by recovery.diagnostics_timeout_ms fails
// its slot.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "launcher/controller/controller_impl.h"
#include "robust/diagnostics.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// Ids of diagnostic processes on their slots: far above any rank of the job, and apart from
// the replay's (controller_replay.cc, 1 << 24).
constexpr int kDiagnoseIdBase = (1 << 24) + (1 << 22);

}  // namespace

std::vector<int> Controller::Impl::diagnose(const std::set<int>& suspect_slots,
                                            report::Incident* inc) {
  const int budget_ms = o.cfg.recovery().diagnostics_timeout_ms();
  auto none = [&](const std::string& why) {
    inc->set_diagnostics_summary("no diagnostics: " + why);
    LOG(WARNING) << "no diagnostics: " << why;
    event("diagnostics", EventFields().add("summary", inc->diagnostics_summary()));
    return std::vector<int>{};
  };
  if (budget_ms <= 0) return none("recovery.diagnostics_timeout_ms is 0");

  // The suspects' ranks, and every member of their groups: a group test needs all of it.
  std::set<int> suspects, ranks;
  for (int r = 0; r < world; ++r)
    if (suspect_slots.count(host->slot_of(r))) suspects.insert(r);
  if (suspects.empty()) return none("no rank runs on the suspect slots");
  for (int r : suspects)
    for (const std::vector<int>& g : {topo.tp_group(r), topo.pp_group(r), topo.dp_group(r)})
      ranks.insert(g.begin(), g.end());
  std::string suspect_list;
  for (int r : suspects) suspect_list += detail::concat(suspect_list.empty() ? "" : ",", r);

  const std::string key = detail::concat("diag/", incidents, "/", epoch);
  std::vector<std::pair<int, int>> started;  // (slot, id)
  std::map<int, int> index;                  // job rank -> its stand-in's index
  for (int r : ranks) index.emplace(r, int(index.size()));
  for (int r : ranks) {
    std::map<std::string, std::string> env = rank_env(index[r], /*restarted=*/false);
    env["KEEL_WORLD_SIZE"] = std::to_string(ranks.size());
    env["KEEL_DIAGNOSE"] = detail::concat(key, ":", r, ":", epoch);
    env["KEEL_DIAGNOSE_SUSPECTS"] = suspect_list;
    env.erase("KEEL_CONTROLLER");  // it reports nothing: its answer is in the store
    const int slot = host->slot_of(r);
    if (!host->spawn_extra(slot, kDiagnoseIdBase + r, env)) {
      if (started.empty()) return none("this host cannot start processes on slots");
      continue;  // counted as silent below
    }
    started.emplace_back(slot, kDiagnoseIdBase + r);
  }
  event("diagnostics_start", EventFields()
                                 .add("key", key)
                                 .add("suspects", suspect_list)
                                 .add("processes", double(started.size())));

  // Every stand-in answers once; whoever has not by the deadline fails its slot.
  std::map<int, report::Diagnostic> answers;
  const auto deadline = Clock::now() + std::chrono::milliseconds(budget_ms);
  while (answers.size() < ranks.size() && Clock::now() < deadline) {
    pump();
    for (int r : ranks) {
      if (answers.count(r)) continue;
      try {
        const std::string v =
            store->get(detail::concat(key, "/result/", r), std::chrono::milliseconds(1));
        report::Diagnostic d;
        if (!d.ParseFromString(v)) {
          d.Clear();
          d.set_answered(true);
          d.set_error("its answer is not a keel.report.Diagnostic");
        }
        answers[r] = d;
      } catch (const CommTimeout&) {
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (const auto& [slot, id] : started) host->kill_extra(slot, id);

  std::vector<report::Diagnostic> rows;
  for (int r : ranks) {
    report::Diagnostic d;
    if (auto it = answers.find(r); it != answers.end()) {
      d = it->second;
    } else {
      d.set_answered(false);
      d.set_error(detail::concat("no answer within ", budget_ms, " ms"));
    }
    // The controller's placement is the truth about where it ran.
    d.set_rank(r);
    d.set_slot(host->slot_of(r));
    rows.push_back(d);
  }
  const diag::Verdict v =
      diag::judge(rows, suspect_slots, o.cfg.detect().slow_factor() * diag::kOneShotSlowMargin);
  for (const report::Diagnostic& d : rows) *inc->add_diagnostics() = d;
  inc->set_diagnostics_summary(v.summary);
  inc->set_diagnosed_at(unix_now());
  LOG(WARNING) << "diagnostics: " << v.summary;
  std::string failed;
  for (int s : v.failed_slots) failed += detail::concat(failed.empty() ? "" : ",", s);
  event("diagnostics",
        EventFields().add("summary", v.summary).add("failed_slots", failed).add("key", key));
  return v.failed_slots;
}

}  // namespace keel
