#include "launcher/controller/diagnose_coordinator.h"

#include <algorithm>
#include <thread>

#include "launcher/job_env.h"
#include "launcher/recovery_protocol.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/diagnostics.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// Ids of diagnostic processes on their slots: far above any rank of the job, and apart from
// the replay's (replay_coordinator.cc, 1 << 24).
constexpr int kDiagnoseIdBase = (1 << 24) + (1 << 22);
// Between looks at the stand-ins' answers.
constexpr std::chrono::milliseconds kPollPause{5};

template <class C>
std::string join(const C& xs) {
  std::string out;
  for (int x : xs) out += detail::concat(out.empty() ? "" : ",", x);
  return out;
}

}  // namespace

std::vector<report::Diagnostic> DiagnoseCoordinator::collect(const std::string& key,
                                                             const std::set<int>& ranks,
                                                             int budget_ms) {
  // Every stand-in answers once; whoever has not by the deadline fails its slot.
  std::map<int, report::Diagnostic> answers;
  const auto deadline = Clock::now() + std::chrono::milliseconds(budget_ms);
  while (answers.size() < ranks.size() && Clock::now() < deadline) {
    ctx_.pump_once();
    for (int r : ranks) {
      if (answers.count(r)) continue;
      const std::optional<std::string> v = ctx_.store->try_get(keys::diagnose_result_key(key, r));
      if (!v) continue;
      report::Diagnostic d;
      if (!d.ParseFromString(*v)) {
        d.Clear();
        d.set_answered(true);
        d.set_error("its answer is not a keel.report.Diagnostic");
      }
      answers[r] = d;
    }
    std::this_thread::sleep_for(kPollPause);
  }

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
    d.set_slot(ctx_.host->slot_of(r));
    rows.push_back(d);
  }
  return rows;
}

std::vector<int> DiagnoseCoordinator::run(const std::set<int>& suspect_slots, int incident,
                                          report::Incident* inc) {
  const int budget_ms = ctx_.cfg().recovery().diagnostics_timeout_ms();
  auto none = [&](const std::string& why) {
    inc->set_diagnostics_summary("no diagnostics: " + why);
    LOG(WARNING) << "no diagnostics: " << why;
    ctx_.event("diagnostics", EventFields().add("summary", inc->diagnostics_summary()));
    return std::vector<int>{};
  };
  if (budget_ms <= 0) return none("recovery.diagnostics_timeout_ms is 0");

  // The suspects' ranks, and every member of their groups: a group test needs all of it.
  const Topology& topo = ctx_.members->topo();
  const int epoch = ctx_.members->epoch();
  RankHost* host = ctx_.host;
  std::set<int> suspects, ranks;
  for (int r = 0; r < topo.world_size(); ++r)
    if (suspect_slots.count(host->slot_of(r))) suspects.insert(r);
  if (suspects.empty()) return none("no rank runs on the suspect slots");
  for (int r : suspects)
    for (const std::vector<int>& g : {topo.tp_group(r), topo.pp_group(r), topo.dp_group(r)})
      ranks.insert(g.begin(), g.end());
  const std::string suspect_list = join(suspects);

  // The task: stand-in i stands in for job rank job_ranks[i].
  const std::string key = keys::diagnose_key(incident, epoch);
  store::DiagnoseTask task;
  task.set_epoch(epoch);
  for (int r : ranks) task.add_job_ranks(r);
  for (int r : suspects) task.add_suspects(r);
  set_message(*ctx_.store, keys::diagnose_task_key(key), task);

  std::vector<std::pair<int, int>> started;  // (slot, id)
  int index = 0;
  for (int r : ranks) {
    std::map<std::string, std::string> env = ctx_.stand_in_env(index++, int(ranks.size()));
    env[env::kDiagnose] = key;
    const int slot = host->slot_of(r);
    if (!host->spawn_extra(slot, kDiagnoseIdBase + r, env)) {
      if (started.empty()) return none("this host cannot start processes on slots");
      continue;  // counted as silent below
    }
    started.emplace_back(slot, kDiagnoseIdBase + r);
  }
  ctx_.event("diagnostics_start", EventFields()
                                      .add("key", key)
                                      .add("suspects", suspect_list)
                                      .add("processes", double(started.size())));

  const std::vector<report::Diagnostic> rows = collect(key, ranks, budget_ms);
  for (const auto& [slot, id] : started) host->kill_extra(slot, id);
  const diag::Verdict v = diag::judge(rows, suspect_slots,
                                      ctx_.cfg().detect().slow_factor() * diag::kOneShotSlowMargin);
  for (const report::Diagnostic& d : rows) *inc->add_diagnostics() = d;
  inc->set_diagnostics_summary(v.summary);
  inc->set_diagnosed_at(recovery::unix_now());
  LOG(WARNING) << "diagnostics: " << v.summary;
  ctx_.event("diagnostics", EventFields()
                                .add("summary", v.summary)
                                .add("failed_slots", join(v.failed_slots))
                                .add("key", key));
  return v.failed_slots;
}

}  // namespace keel
