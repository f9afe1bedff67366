// What to do when the job fails (DESIGN.md, Failure handling): given the failure, the
// membership and what each rank can restore from, a plan — which ranks to start again, which
// slots to evict and which standbys take their ranks, whether data parallelism shrinks or
// grows, the restore step and where each rank restores from, the ladder rung and why.
//
// Pure code: no processes, no store, no clock. launcher/controller carries a plan out
// through one epoch transition (abort → ack → decide → rebuild → restore), whatever the plan.
//
// What happens on each kind of failure (recovery.mode hot_swap, the default):
//   crash / exit of a worker on a live slot  the rank is restarted in place;
//   slot lost or partitioned                 its slot is evicted, a ready standby takes its
//                                            ranks (recovery.evict widens the eviction to the
//                                            culprit's PP group or DP replica);
//   hang (a rank named by detection)         on a slot: evicted like a lost slot (a hung
//                                            machine is not trusted); without slots:
//                                            restarted in place;
//   communication error, no culprit          reattempt in place: every rank rebuilds;
//   fail-slow degrader (slow)                its slot is evicted like a hung one
//                                            (decide_slow says when, else only a warning);
//   no culprit, diagnostics failed a slot    the slot is evicted (rung 2);
//   the same again within the window         roll back to the newest persistent
//                                            checkpoint (rung 3; climb);
//   silent data corruption (sdc)             the culprit's slot is evicted like a hung one
//                                            (without slots its rank restarts); everyone
//                                            rolls back to the newest verified step; with
//                                            no culprit named, only the rollback;
//   no standby ready                         recovery.on_no_standby: fail, wait, shrink_dp,
//                                            reshape (robust/reshape_plan.h).
// in_place never evicts (a lost slot: detect.on_slot_loss fail | wait). restart_all stops every
// rank and restarts all of them from the newest persistent checkpoint, placing a lost slot's
// ranks on a standby. The restore point is the newest step every rank holds in memory, in
// its own snapshot or at its backup holder; when none is common, the newest persistent
// checkpoint; when there is none, the job stops naming what was lost (unless
// recovery.allow_restart_from_scratch).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "parallel/topology.h"
#include "proto/config.pb.h"
#include "proto/membership.pb.h"

namespace keel::policy {

// The membership as the controller sees it when it decides.
struct ClusterView {
  Topology topo{1, 1, 1};
  int configured_dp = 1;
  int workers_per_slot = 1;
  std::vector<int> rank_slot;  // rank -> slot; empty without slots (keel-worker --nproc)
  // Slot -> state; empty without slots.
  std::map<int, membership::SlotInfo::State> slots;
  // The slot whose machine runs the controller in the same process as its agent (mpirun's
  // slot 0): never evicted. -1: none (the controller runs in a process of its own).
  int controller_slot = 0;
  std::set<int> ready_standbys;    // standby slots whose self-check passed
  std::set<int> pending_standbys;  // standby slots still checking themselves
  // The recovery has waited recovery.standby_wait_ms: it decides without a standby (pending
  // ones are left out, and on_no_standby = wait stops with the reason).
  bool standby_wait_over = false;

  bool has_slots() const { return !rank_slot.empty(); }
  int slot_of(int rank) const { return has_slots() ? rank_slot[size_t(rank)] : -1; }
  std::vector<int> ranks_on(int slot) const;
};

enum class FailureKind { kCrash, kExit, kHang, kSlotLoss, kPartition, kCommError, kSdc, kSlow };
const char* failure_kind_name(FailureKind k);

// What went wrong, as detection saw it.
struct Failure {
  FailureKind kind = FailureKind::kCommError;
  int culprit = -1;                 // the rank detection named (-1: none)
  bool culprit_is_machine = false;  // the replay named a machine: culprit is any rank of it
  std::set<int> dead;               // ranks whose processes are gone or must be killed
  std::set<int> lost_slots;         // slots that went silent (their ranks are in `dead`)
  std::string rule;                 // how it was found ("exit", "heartbeat", "liveness", ...)
  // kSdc: the newest step the SDC checks verified. Every state after it may be corrupt, so
  // the restore goes no further than this (memory or a persistent checkpoint); -1 with no
  // verified step, unbounded for other failures.
  std::optional<int64_t> restore_at_most;
  // The ladder (climb below) ran its mechanism before the decision:
  std::set<int> failed_slots;    // rungs 2, 4: slots the diagnostics or the replay failed
  bool diagnosed = false;        // rung 2 ran (and these are all that failed)
  bool from_checkpoint = false;  // rung 3: restore the newest persistent checkpoint
  // A replay an operator asked for (keel-ctl replay) found no machine that fails both
  // phases: nothing is suspect, so the job goes on from its newest step (no rollback).
  bool replay_cleared = false;
  std::string ladder_why;  // rungs 2-4: why the ladder got here
};

// What one rank can restore (steps completed), from slot headers: a restore verifies the
// slot it loads, tries the next source on a mismatch and drops the damaged slot.
struct Holdings {
  std::optional<int64_t> live;  // a survivor that acknowledged the abort: its state's step
  std::set<int64_t> own;        // its own snapshot slots
  std::set<int64_t> backup;     // the copy at its backup holder (a replica's own slots, or a
                                // pushed backup: ckpt/backup_placement.h)
};

struct Options {
  config::RecoveryConfig recovery;
  config::DetectConfig detect;
  bool zero1 = false;
  int micro_batch = 1, global_batch = 1;
  int64_t persistent_step = -1;  // newest complete persistent checkpoint (-1: none)
  // on_no_standby = reshape: the job's layout as configured (unset: the current one), and
  // why the model cannot be laid out as a given layout ("" when it can; unset: any can).
  std::optional<Topology> configured;
  std::function<std::string(const Topology&)> layout_invalid;
};

// Where the job restores from.
struct RestorePoint {
  int64_t step = -1;                                   // steps completed; -1: the start state
  membership::Source job_source = membership::memory;  // persistent / scratch for all ranks
  std::map<int, membership::Source> sources;           // per rank
  std::string why;  // why memory did not suffice (persistent, scratch, or stop)
  bool ok = true;   // false: nothing restores every rank; the job must stop
};

// The newest step every rank of `world` can restore. `holder_slot(r)` names where rank r's
// backup lives, `own_slot(r)` its own snapshot, for messages (-1: unknown).
RestorePoint restore_point(const std::map<int, Holdings>& have, int world, int64_t persistent_step,
                           bool allow_scratch,
                           const std::map<int, std::pair<int, int>>& where = {});

// What a recovery does, as DESIGN.md's ladder names it (the ladder's rung before the
// decision is robust/ladder.h's Rung): restart the culprit in place, evict its slot for a
// standby, reattempt in place, roll back, restart every rank, shrink or grow data
// parallelism.
enum class PlanRung {
  kRestart,
  kEvict,
  kReattempt,
  kRollback,
  kRestartAll,
  kShrink,
  kGrow,
  kReshape
};
// "restart", "evict", "reattempt", "rollback", "restart_all", "shrink", "grow", "reshape": the
// incident's rung field.
const char* plan_rung_name(PlanRung r);

struct Plan {
  enum class Kind {
    kRecover,  // carry it out
    kWait,     // nothing can be done yet (a standby is checking itself, on_no_standby = wait,
               // on_slot_loss = wait): decide again when the view changes
    kStop,     // the job must stop (`why` says why)
  };
  Kind kind = Kind::kRecover;
  // kWait: for a standby (one still checking itself, or on_no_standby = wait), which
  // recovery.standby_wait_ms bounds; else for a lost slot's return (on_slot_loss = wait).
  bool waits_for_standby = false;
  PlanRung rung = PlanRung::kReattempt;  // the incident's `rung` is plan_rung_name(rung)
  std::string why;                       // one line: why this rung
  std::string action;                    // one line for the incident
  bool restart_all = false;              // every rank is stopped and started again
  std::set<int> kill;                    // live ranks to stop first (evicted, retired)
  std::set<int> restart;                 // ranks (ids of the next epoch) to start
  std::vector<int> evict;                // slots taken out of the job
  std::map<int, int> promote;            // evicted slot -> standby slot that takes its ranks
  std::vector<int> retire_slots;         // slots left without ranks (shrink, reshape): standbys
  std::optional<Topology> next_topo;     // shrink / grow / reshape
  std::map<int, int> renumber;           // old -> new id for every rank that stays
  std::vector<int> new_ranks;            // grow: the ranks of the new replica
  RestorePoint restore;
};

// The decision for a failure. `have` is keyed by the ranks' current ids.
Plan decide(const Failure& f, const ClusterView& view, const std::map<int, Holdings>& have,
            const Options& o);

// After a shrink: whether standbys for a whole replica are ready, so that the job can grow
// back by one (the caller then aborts the ranks and asks decide_grow).
bool can_grow(const ClusterView& view, const Options& o);
// The plan to grow back by one replica, given the survivors' holdings; nullopt: not now.
std::optional<Plan> decide_grow(const ClusterView& view, const std::map<int, Holdings>& have,
                                const Options& o);

// A fail-slow degrader (robust/slow_rules.h) named `culprit`: whether to evict its slot
// (detect.on_slow = evict, hot_swap with slots, its slot not the controller's, a standby
// ready), or
// only warn; `why` says which and why.
struct SlowAction {
  bool evict = false;
  std::string why;
};
SlowAction decide_slow(int culprit, const ClusterView& view, const Options& o);

// How long a survivor may take to answer an abort before it is declared hung:
// max(recovery.abort_timeout_ms, abort_timeout_steps × the median step time).
int64_t abort_deadline_ms(const config::RecoveryConfig& rc, double median_step_s);

}  // namespace keel::policy
