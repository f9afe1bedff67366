// The escalation ladder's rung for a failure (DESIGN.md, Failure handling): pure code with a
// little memory, asked by the controller between the acks and the decision, so that it can
// run the rung's mechanism (diagnostics, a rollback, a replay) before policy::decide.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "robust/recovery_policy.h"

namespace keel::policy {

// The escalation ladder (DESIGN.md, Failure handling), before the decision: a failure with a
// clear culprit is rung 1 (decide evicts or restarts it). One without — every rank saw a
// communication error, no process died — climbs: rung 2 runs stop-time diagnostics (a slot
// that fails them is evicted, else the ranks reattempt in place); the same again within
// recovery.repeat_window_steps of the last one is rung 3, a rollback (to the previous plugin
// when an update was applied within the window, else to the newest persistent checkpoint);
// again, or a suspected silent data corruption with no rank named, is rung 4: a dual-phase
// replay looks for the machine.
enum class Rung { kCulprit = 1, kDiagnose = 2, kRollback = 3, kReplay = 4 };
// "culprit", "diagnose", "rollback", "replay".
const char* rung_name(Rung r);

// What the ladder remembers between failures.
struct LadderMemory {
  // The culprit-less failures so far: steps completed when each happened (ascending).
  std::vector<int64_t> culpritless;
  int64_t update_applied_step = -1;  // the newest hot update applied (-1: none)
};

struct LadderStep {
  Rung rung = Rung::kCulprit;
  bool plugin_rollback = false;  // rung 3: the previous plugin (else the checkpoint)
  std::string why;               // one line
};

// The rung for failure `f` seen with `completed` steps done; remembers it in *m.
LadderStep climb(const Failure& f, int64_t completed, LadderMemory* m, const Options& o);

}  // namespace keel::policy
