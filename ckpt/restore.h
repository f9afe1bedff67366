// Loading a rank's state back from a snapshot (DESIGN.md, Recovery protocol, step 4): from
// the rank's own slot if it holds the step and passes its checks, else from the backup
// holder. Also the supervisor's cheap view of which steps a rank could restore.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/check.h"

namespace keel {

class SnapshotRegion;
class TrainState;

// No source holds a usable copy of the step. The message names every source tried and why
// it was refused.
class RestoreError : public Error {
 public:
  explicit RestoreError(const std::string& what) : Error(what) {}
};

struct RestoreResult {
  std::string source;                // "own slot (/keel-job-r3)", "backup held by rank 5 (...)"
  std::vector<std::string> skipped;  // earlier sources and why each was passed over
  // The checksum (ckpt/checksum.h) of the state as loaded, verified on the way in: a caller
  // that needs it need not hash the state again.
  std::optional<uint64_t> checksum;
};

// Loads snapshot `step` of rank `owner_rank` into `state` and sets state.step() to `step`.
// Tries `own` (may be null) first, then the BackupServer at `holder_addr` (may be empty);
// `holder_rank` only names the holder in messages. Each source is verified as it is used
// (surveys read headers only): one whose layout fingerprint or checksum does not match is
// skipped, and a damaged slot is dropped from `own` (if writable) or by the holder, so that
// no later survey offers its step. Throws RestoreError if no source has the step; the state
// is then as it was if no backup payload was received, else partly overwritten.
RestoreResult restore_state(TrainState& state, int64_t step, SnapshotRegion* own,
                            const std::string& holder_addr, int owner_rank, int holder_rank = -1,
                            std::chrono::milliseconds timeout = std::chrono::seconds(30));

// A BackupServer to fetch from: its "host:port", and the rank that runs it (for messages;
// -1: none named).
struct BackupSource {
  std::string addr;
  int rank = -1;
  // load_state_from_memory (ckpt/memory_reshard.h): the rank whose copy this server gives for
  // the one asked for, when another's is the same state (a DP replica without ZeRO-1);
  // -1: the asked rank's own.
  int copy_of = -1;
};
// The same with several servers, tried in order after `own`: a replay on another machine asks
// the rank's holder, then the rank's own server, which serves the rank's own snapshots.
RestoreResult restore_state(TrainState& state, int64_t step, SnapshotRegion* own,
                            const std::vector<BackupSource>& servers, int owner_rank,
                            std::chrono::milliseconds timeout = std::chrono::seconds(30));

// Steps rank `rank` of `job` could restore, newest first: the valid slots of its own
// segment and those of `holder`'s backup segment written for it (holder < 0: none). Reads
// the segments read-only. Without `verify` only the headers are read (what surveys use:
// restore_state() verifies a slot when it loads it and falls back to the next source); with
// it each slot's checksum is checked too, a pass over its bytes.
std::vector<int64_t> restorable_steps(const std::string& job, int rank, int holder,
                                      bool verify = false);
// The steps of `owner`'s state that rank `holder` of `job` keeps, newest first (slot headers
// only): in its backup segment, or with `replica` (ckpt/backup_placement.h) in its own
// snapshot segment, which holds the same state.
std::vector<int64_t> held_steps(const std::string& job, int owner, int holder, bool replica);
// The steps of `owner` (-1: the region's own) that `region` holds and whose checksums
// verify, newest first (a pass over every slot).
std::vector<int64_t> verified_steps(const SnapshotRegion& region, int owner = -1);

}  // namespace keel
