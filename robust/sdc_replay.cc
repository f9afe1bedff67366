#include "robust/sdc_replay.h"

#include <algorithm>
#include <map>

#include "runtime/check.h"

namespace keel::sdc {

ReplayPlan plan_replay(const std::vector<int>& machines, int ranks_per_group,
                       int workers_per_slot) {
  ReplayPlan p;
  const int g =
      (ranks_per_group + std::max(1, workers_per_slot) - 1) / std::max(1, workers_per_slot);
  p.slots_per_group = g;
  const int n = g > 0 ? int(machines.size()) / g : 0;
  if (n < 3) {
    p.why_not = detail::concat("a replay needs three groups of ", g, " machine", g == 1 ? "" : "s",
                               " (one ", ranks_per_group, "-rank pipeline each) and the job has ",
                               machines.size(), " machine", machines.size() == 1 ? "" : "s",
                               " (active and ready standbys)");
    return p;
  }
  std::vector<std::vector<int>> contiguous(static_cast<size_t>(n)), strided(static_cast<size_t>(n));
  for (int i = 0; i < n * g; ++i) {
    contiguous[size_t(i / g)].push_back(machines[size_t(i)]);
    strided[size_t(i % n)].push_back(machines[size_t(i)]);
  }
  p.phases = {contiguous, strided};
  return p;
}

std::optional<std::set<int>> failing_groups(const std::vector<std::string>& digests) {
  std::map<std::string, int> count;
  for (const auto& d : digests)
    if (!d.empty()) ++count[d];
  for (const auto& [d, c] : count)
    if (2 * c > int(digests.size())) {
      std::set<int> failing;
      for (size_t i = 0; i < digests.size(); ++i)
        if (digests[i] != d) failing.insert(int(i));
      return failing;
    }
  return std::nullopt;
}

std::vector<int> replay_culprits(const ReplayPlan& plan,
                                 const std::vector<std::set<int>>& failing) {
  std::vector<int> out;
  if (plan.phases.empty() || failing.size() != plan.phases.size()) return out;
  std::map<int, int> phases_failed;  // machine -> phases in which its group failed
  for (size_t ph = 0; ph < plan.phases.size(); ++ph)
    for (int g : failing[ph])
      for (int m : plan.phases[ph][size_t(g)]) ++phases_failed[m];
  for (const auto& [m, k] : phases_failed)
    if (k == int(plan.phases.size())) out.push_back(m);
  return out;
}

}  // namespace keel::sdc
