// Where each rank's snapshot backup lives (DESIGN.md, Checkpoints): on a peer outside the
// rank's own TP, PP and DP groups wherever the layout allows, so evicting a whole group
// never takes a snapshot down together with its owner. A pure function of the topology;
// every process computes the same placement without talking.
#pragma once

#include <string>

#include "parallel/topology.h"

namespace keel {

struct BackupPlacement {
  int holder = -1;   // the rank that keeps the backup; -1: none (a world of one rank)
  std::string rule;  // which rule chose it, for logs and reports
};

// The holder of `rank`'s backup. For coordinates (d, p, t) in a layout of sizes (D, P, T):
//   D > 1 and P > 1: (d+1 mod D, p+1 mod P, t)  "default"
//   otherwise every dimension of size > 1 shifts by one, e.g. P = 1: (d+1, p, t+1); with
//   two such dimensions this still avoids all three groups;
//   only one dimension > 1: the holder necessarily shares that group (the rule says which);
//   a single rank: no holder.
// The map is a bijection: each rank holds exactly one other rank's backup.
BackupPlacement backup_holder(const Topology& topo, int rank);

// The inverse: the rank whose backup `holder` keeps (-1 for a single rank).
int backup_owner(const Topology& topo, int holder);

}  // namespace keel
