// One rank's in-memory snapshots: a POSIX shared-memory segment with TWO rotating slots, so a
// crash in the middle of writing one slot always leaves the other (the newest complete
// snapshot) intact, and a third, the verified slot, that keeps the newest state the silent
// data corruption checks passed on (robust/sdc_check.h) until the next check passes: a
// rollback after a corruption lands there. Its pages are touched only when it is written. The
// segment outlives the process that wrote it: a worker restarted in place reopens it and restores,
// and the supervisor reads which steps it holds. The supervisor unlinks every segment of a job when
// the job ends (unlink_job_segments).
//
// The same format holds a peer's snapshots in a backup segment (ckpt/backup_service.h).
//
// Write protocol, per slot (guards against a crash mid-copy and against readers in other
// processes): pick the slot NOT holding the newest valid snapshot; store step = -1; copy the
// payload; compute its checksum; write bytes, checksum, fingerprint; store step LAST with
// release order. A reader loads step with acquire order and trusts nothing of a slot whose
// step is -1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/check.h"

namespace keel {

class TrainState;

// A snapshot segment that cannot be used as asked (another capacity or layout, a foreign
// format). The message names the segment.
class SnapshotError : public Error {
 public:
  explicit SnapshotError(const std::string& what) : Error(what) {}
};

// "/keel-<job>-r<rank>": the rank's own snapshots. Throws InputError if `job` is empty or
// contains '/'.
std::string snapshot_segment_name(const std::string& job, int rank);
// "/keel-<job>-b<holder>": the backups that rank `holder` keeps for its backup owner.
std::string backup_segment_name(const std::string& job, int holder_rank);
// Names (with the leading '/') of every snapshot and backup segment of `job` in `shm_dir`:
// /dev/shm, or the directory another machine's /dev/shm is (tests/integration/netns.h).
std::vector<std::string> job_segments(const std::string& job,
                                      const std::string& shm_dir = "/dev/shm");
// Unlinks every segment job_segments() lists; returns how many it removed. Mappings still
// open elsewhere stay valid until unmapped.
int unlink_job_segments(const std::string& job);

// A process that owns its job's segments outright (a rank started alone: no supervisor or
// agent cleans up after it) registers them here: its own snapshot and backup segments of
// `job` are then unlinked when SIGINT, SIGTERM or SIGHUP ends it (the handler unlinks, then
// the signal ends the process as before, so its exit status still names the signal) and
// when remove_owned_segments() is called on a path that skips destructors (an injected exit
// fault's _exit). SIGKILL cannot be caught: a later run removes the segments of a dead PID.
// Call from one thread, before the segments are created; calling again replaces the names.
void own_segments_until_exit(const std::string& job, int rank);
// Unlinks the segments own_segments_until_exit() registered (none registered: nothing).
// Async-signal-safe: unlink(2) of names fixed at registration.
void remove_owned_segments();

// A committed slot as read from its header (payload points into the mapping).
struct SlotView {
  int slot = -1;
  int64_t step = -1;
  const char* payload = nullptr;
  size_t bytes = 0;
  uint64_t checksum = 0;
  uint64_t fingerprint = 0;
  int owner_rank = -1;
  int64_t written_at = 0;  // unix seconds
  bool verified = false;   // the SDC checks passed on this state
};

class SnapshotRegion {
 public:
  static constexpr int kSlots = 3;
  static constexpr int kRotatingSlots = 2;  // slots 0 and 1: every step's snapshot
  static constexpr int kVerifiedSlot = 2;

  // Opens the writer's segment `name`, creating it for payloads of up to `capacity` bytes of
  // layout `fingerprint` if it does not exist. An existing segment keeps its valid slots (a
  // restarted rank restores from them); one made for another capacity or fingerprint throws
  // SnapshotError naming the segment and both values. A new segment's rotating slots are
  // faulted in before it returns, or, `populate_in_background`, by a thread of the region's
  // while the caller goes on (a rank joining a running job: a promoted standby has its
  // restore and first step to do; writing the slots meanwhile is safe, each page is faulted
  // in once by whichever touches it first).
  static std::unique_ptr<SnapshotRegion> open_or_create(const std::string& name, size_t capacity,
                                                        uint64_t fingerprint, int owner_rank,
                                                        bool populate_in_background = false);
  // Opens an existing segment (read-only unless `writable`); nullptr if there is none or it
  // is still being created. Throws SnapshotError if it is not a keel snapshot segment.
  static std::unique_ptr<SnapshotRegion> open_existing(const std::string& name,
                                                       bool writable = false);

  // Unmaps; never unlinks (the snapshots must outlive this process).
  ~SnapshotRegion();
  SnapshotRegion(const SnapshotRegion&) = delete;
  SnapshotRegion& operator=(const SnapshotRegion&) = delete;

  const std::string& name() const { return name_; }
  // Bytes of the whole segment (header and all slots), mapped; the verified slot is resident
  // only once written (verified_slot_bytes()).
  size_t mapped_bytes() const { return mapped_; }
  size_t verified_slot_bytes() const;
  size_t capacity() const;
  uint64_t fingerprint() const;
  int owner_rank() const;
  bool writable() const { return writable_; }

  // Steps of the valid slots, newest first (headers only: cheap, no checksum). With
  // owner >= 0 only slots written for that owner rank.
  std::vector<int64_t> valid_steps(int owner = -1) const;
  // The committed slot holding `step` (for `owner` if >= 0), if any.
  std::optional<SlotView> find(int64_t step, int owner = -1) const;
  // Slot `slot` (0 .. kSlots-1) if it is committed.
  std::optional<SlotView> slot_view(int slot) const;
  // Recomputes the payload checksum of a committed slot; false with the reason on mismatch.
  static bool verify(const SlotView& v, std::string* why);

  // --- writing (a writable region, one writer at a time) ---
  // The slot the next write must use: the rotating one not holding the newest valid snapshot.
  int free_slot() const;
  // Invalidates every slot holding a step >= `step` (written for `owner` if >= 0): after a
  // restore to an older step those snapshots describe a history that was undone, and a new
  // snapshot of `step` must not sit next to a stale one of the same number. Returns how many.
  int invalidate_from(int64_t step, int owner = -1);
  // Marks `slot` invalid; from here until commit() its payload may be overwritten.
  void begin_write(int slot);
  char* payload(int slot);
  // Publishes the slot: header fields first, step last (release).
  void commit(int slot, int64_t step, size_t bytes, uint64_t checksum, uint64_t fingerprint,
              int owner_rank, bool verified = false);
  // The whole protocol for a TrainState: copies its spans (backend copy_to_host) into `slot`
  // (-1: free_slot()) as snapshot `step`, marked `verified` if asked. Returns the slot written.
  int write(TrainState& state, int64_t step, int slot = -1, bool verified = false);

  // Loads snapshot `step` into `state` after checking layout fingerprint, size and checksum.
  // Returns false with the reason ("no slot holds step 12 (valid: 11, 10)", "slot checksum
  // mismatch", ...). A failed check leaves the state untouched; only a concurrent writer
  // overwriting the slot mid-copy (reported as such) can leave it partly loaded.
  bool read(int64_t step, TrainState& state, std::string* why) const;

 private:
  struct Header;
  SnapshotRegion(std::string name, void* base, size_t mapped, bool writable);
  Header* header() const;

  std::string name_;
  void* base_;
  size_t mapped_;
  bool writable_;
  std::thread populating_;  // open_or_create's populate_in_background; joined before unmapping
};

// Test and ops helper: flips one byte (at `offset` modulo the payload size) of the payload of
// the slot holding `step` in segment `name`, in place, leaving its header valid. Returns false
// if no valid slot holds that step.
bool corrupt_snapshot_slot(const std::string& name, int64_t step, size_t offset = 0);

}  // namespace keel
