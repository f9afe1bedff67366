// A rank's state in one layout, loaded from the in-memory copies of a job's ranks in another
// (issue 30, part 2: reshaping when machines run out, from memory): each old rank's copy of
// the step is read from a BackupServer that holds it (a rank's own server serves its own
// snapshots, its holder the pushed backup), only the byte ranges the new rank needs, through
// the resharding planner (ckpt/reshard_plan.h) — the same plan a persistent checkpoint is
// read through (ckpt/checkpoint_reshard.h). Host memory: one span of the new rank's state.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "ckpt/reshard_plan.h"
#include "ckpt/restore.h"

namespace keel {

class TrainState;

// Where old rank r's copy of the step may be read, in the order to try.
using CopySources = std::function<std::vector<BackupSource>(int old_rank)>;

// Fills rank `rank` of `to` from the copies of `step` of `from`'s ranks and sets the step.
// A source that lacks the step, refuses or fails is passed over for the next; throws
// RestoreError naming every source tried for the first range none could give (the state is
// then partly overwritten: the caller's StateRewrite discards it).
void load_state_from_memory(const ShardedLayout& from, const ShardedLayout& to, int rank,
                            int64_t step, const CopySources& sources, TrainState& state,
                            std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace keel
