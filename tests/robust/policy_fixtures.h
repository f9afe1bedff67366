// What the recovery-policy tests share: the ranks' holdings of a job that ran to step S.
#pragma once

#include <cstdint>
#include <map>
#include <set>

#include "robust/recovery_policy.h"

namespace keel::policy {

// Every rank holds steps {S-1, S} in its own snapshot and at its holder; survivors (not in
// `dead`) hold S live.
inline std::map<int, Holdings> holdings(int world, int64_t S, const std::set<int>& dead = {}) {
  std::map<int, Holdings> h;
  for (int r = 0; r < world; ++r) {
    if (!dead.count(r)) h[r].live = S;
    h[r].own = {S - 1, S};
    h[r].backup = {S - 1, S};
  }
  return h;
}

}  // namespace keel::policy
