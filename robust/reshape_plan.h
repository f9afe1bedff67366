// recovery.on_no_standby = reshape (issue 30, part 2): the plan when slots are out, no standby
// is ready and data parallelism cannot shrink. The layout comes from robust/reshape_layout.h;
// this says which survivor becomes which rank of it, which slots retire (they check
// themselves and wait as standbys), and which step every new rank can read from the old
// ranks' copies in memory (or the newest persistent checkpoint, when memory cannot cover it).
#pragma once

#include <map>
#include <optional>
#include <set>

#include "robust/recovery_policy.h"
#include "robust/reshape_layout.h"

namespace keel::policy {

// `out`: ranks whose processes are gone or are stopped by the failure; `gone_slots`: slots
// lost or evicted; `have`: what each old rank's copies hold, already reduced to what
// survives the failure (recovery_policy.cc's usable()). Survivors keep their slot and their
// place on it: the first slots (by id) hold the new layout's ranks in order.
Plan plan_reshape(const std::set<int>& out, const ClusterView& v,
                  const std::map<int, Holdings>& have, const Options& o,
                  const std::set<int>& gone_slots);

// After a reshape: the layout the job can grow into now that standbys are ready (the
// configured one, or the largest the slots with ranks and the ready standbys hold), nullopt
// when none is larger than the current one. Cheap: called every 200 ms by the controller.
std::optional<ReshapeChoice> reshape_growth(const ClusterView& v, const Options& o);
// The plan to grow into it: the slots with ranks keep them, renumbered in slot order; new
// ranks start on the ready standbys; every rank reads its state from the survivors' copies
// of their newest common step (the survivors' holdings, `have`). nullopt: not now.
std::optional<Plan> plan_reshape_grow(const ClusterView& v, const std::map<int, Holdings>& have,
                                      const Options& o);

}  // namespace keel::policy
