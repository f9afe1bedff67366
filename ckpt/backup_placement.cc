// Backup placement rules; see backup_placement.h.
#include "ckpt/backup_placement.h"

#include "runtime/check.h"

namespace keel {

namespace {

// Shifts every coordinate the chosen rule moves by `dir` (+1: holder, -1: owner).
struct Shift {
  int dd = 0, dp = 0, dt = 0;
  std::string rule;
};

Shift rule_for(const Topology& topo, bool replicas) {
  const bool d = topo.dp() > 1, p = topo.pp() > 1, t = topo.tp() > 1;
  if (replicas && d) return {1, 0, 0, "dp replica (d+1, p, t): holds the same state, none pushed"};
  if (d && p) return {1, 1, 0, "default: (d+1, p+1, t)"};
  if (d && t) return {1, 0, 1, "pp=1: (d+1, p, t+1)"};
  if (p && t) return {0, 1, 1, "dp=1: (d, p+1, t+1)"};
  if (d) return {1, 0, 0, "only dp>1: (d+1, p, t), shares the DP group"};
  if (p) return {0, 1, 0, "only pp>1: (d, p+1, t), shares the PP group"};
  if (t) return {0, 0, 1, "only tp>1: (d, p, t+1), shares the TP group"};
  return {0, 0, 0, "single rank: no peer"};
}

int wrap(int x, int n) {
  return ((x % n) + n) % n;
}

int shifted(const Topology& topo, int rank, const Shift& s, int dir) {
  KEEL_CHECK(rank >= 0 && rank < topo.world_size(), "rank ", rank, " outside a world of ",
             topo.world_size());
  if (topo.world_size() == 1) return -1;
  Coord c = topo.coord(rank);
  c.dp = wrap(c.dp + dir * s.dd, topo.dp());
  c.pp = wrap(c.pp + dir * s.dp, topo.pp());
  c.tp = wrap(c.tp + dir * s.dt, topo.tp());
  return topo.rank(c);
}

}  // namespace

bool replicas_hold_backups(const Topology& topo, bool zero1) {
  return !zero1 && topo.dp() > 1;
}

BackupPlacement backup_holder(const Topology& topo, int rank, bool replicas) {
  Shift s = rule_for(topo, replicas);
  const bool replica = replicas && topo.dp() > 1;
  return {shifted(topo, rank, s, +1), s.rule, replica};
}

int backup_owner(const Topology& topo, int holder, bool replicas) {
  return shifted(topo, holder, rule_for(topo, replicas), -1);
}

}  // namespace keel
