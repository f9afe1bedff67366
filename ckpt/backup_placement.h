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
  // The holder is a DP replica whose own snapshot is the backup: nothing is pushed, and a
  // restore fetches the replica's own slot.
  bool replica = false;
};

// Whether DP replicas serve as each other's backups: without ZeRO-1 the replicas of a
// (pp, tp) coordinate hold identical parameters and moments, so copying one's snapshot to
// another would only duplicate what that one already holds (DESIGN.md, Checkpoints).
bool replicas_hold_backups(const Topology& topo, bool zero1);

// The holder of `rank`'s backup. For coordinates (d, p, t) in a layout of sizes (D, P, T):
//   D > 1 and P > 1: (d+1 mod D, p+1 mod P, t)  "default"
//   otherwise every dimension of size > 1 shifts by one, e.g. P = 1: (d+1, p, t+1); with
//   two such dimensions this still avoids all three groups;
//   only one dimension > 1: the holder necessarily shares that group (the rule says which);
//   a single rank: no holder.
// With `replicas` (see replicas_hold_backups) and D > 1 instead: (d+1 mod D, p, t), the next
// replica, whose own snapshot is the backup.
// The map is a bijection: each rank holds exactly one other rank's backup.
BackupPlacement backup_holder(const Topology& topo, int rank, bool replicas = false);

// The inverse: the rank whose backup `holder` keeps (-1 for a single rank).
int backup_owner(const Topology& topo, int holder, bool replicas = false);

}  // namespace keel
