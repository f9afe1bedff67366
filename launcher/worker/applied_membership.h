// The layout a rank runs in, as the controller last told it: the Membership of the Rebuild
// of its epoch (rebuild/<E>, proto/membership.proto), or for a rank without a controller the
// config's layout. The worker keeps exactly one of these and nothing else that says tp, pp,
// dp or where a rank runs, so no copy of the layout can go stale when the job shrinks or
// grows its data parallelism or reshapes.
#pragma once

#include <vector>

#include "parallel/topology.h"
#include "proto/config.pb.h"
#include "proto/membership.pb.h"

namespace keel {

class AppliedMembership {
 public:
  // The config's layout (parallel.tp, pp, dp), epoch 0, no placement: a rank alone.
  static membership::Membership from_config(const config::JobConfig& cfg);

  // Takes `m` as the layout from now on. Throws keel::Error when it cannot be one (a size
  // below 1, a placement that does not cover every rank, a pp that parallel.stage_layers
  // does not allow). Sets cfg's parallel.tp, pp and dp to m's (a shrink changes dp, a
  // reshape any of them), since the Trainer and the TrainState size themselves from the
  // config.
  void apply(const membership::Membership& m, config::JobConfig* cfg);

  const membership::Membership& membership() const { return m_; }
  // The layout's topology, derived from the Membership when it was applied.
  const Topology& topo() const { return topo_; }
  // The ranks placed on `slot` (empty without a placement or for a slot without ranks).
  std::vector<int> ranks_on_slot(int slot) const;

 private:
  membership::Membership m_;
  Topology topo_{1, 1, 1};
};

}  // namespace keel
