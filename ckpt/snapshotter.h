// Takes a rank's snapshot every step without stalling it (DESIGN.md, Checkpoints): after a
// step, capture() hands the copy of the TrainState into the rank's SnapshotRegion to a
// background thread (on CPU a memcpy; on GPU a device-to-host copy), so it overlaps the next
// step's forward and backward, which only read the parameters. The Trainer's hook calls
// wait_idle() right before the next optimizer update (the first write to the state) and
// before a restore. Each committed slot is then pushed to the backup holder, if one is set,
// from a second thread; a failed push is counted and reported once, never fatal.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "model/state_banks.h"

namespace keel {

class BackupClient;
class SnapshotRegion;
class TrainState;

struct SnapshotterOptions {
  // How long a push retries a refused connection (the holder may be starting up).
  std::chrono::milliseconds connect_timeout{2000};
  // Bounds each stretch of a push without progress.
  std::chrono::milliseconds push_timeout{30000};
  // Both bounds after a push failed, until one succeeds: a dead or hung holder then costs
  // each step at most this much (a capture waits for the push of its slot) until the
  // supervisor rebuilds with a new holder.
  std::chrono::milliseconds degraded_timeout{500};
  // Keep the state in the region's slots where the backend allows (see Snapshotter); false
  // copies it at every capture() as on a GPU.
  bool state_in_slots = true;
};

struct SnapshotStats {
  double wait_idle_seconds = 0;  // callers blocked in wait_idle() and capture(), in total
  double copy_seconds = 0;       // background copy + checksum time, in total
  int64_t copies = 0;
  int64_t pushes = 0;  // pushes the holder committed
  int64_t pushes_failed = 0;
  int64_t bytes_pushed = 0;
  int64_t last_committed_step = -1;
  int64_t last_pushed_step = -1;
  int64_t push_in_flight_step = -1;  // -1: no push in flight
  std::string last_push_error;       // empty if the last push succeeded
};

// On a backend that updates out of place (the CPU), the Snapshotter is also the state's
// StateBanks: the TrainState lives in the region's two slots and the optimizer writes each
// step into the other slot and commits it there (model/train_state.h), so capture() copies
// nothing and only hands the committed slot to the push thread. On a GPU the state stays on
// the device and capture() copies it as described above.
class Snapshotter : public StateBanks {
 public:
  // Borrows both; they must outlive the Snapshotter. The region must be writable. Attaches
  // the state to the region's slots where the backend allows (see above).
  Snapshotter(TrainState* state, SnapshotRegion* region, SnapshotterOptions options = {});
  ~Snapshotter();  // stop()
  Snapshotter(const Snapshotter&) = delete;
  Snapshotter& operator=(const Snapshotter&) = delete;

  // Records state->step() and starts copying the state into the free slot in the background.
  // Waits first for a copy still in flight. A slot whose push is still in flight is never
  // overwritten: the copy then waits for that push to finish (or time out).
  void capture();
  // Blocks until no copy is in flight. Rethrows (as keel::Error) a failure of the last copy.
  void wait_idle();
  // Blocks until no copy and no push is pending or in flight (tests, shutdown).
  void wait_pushed();

  // "host:port" of the backup holder's BackupServer; empty: no backups. May change at any
  // time (after a communicator rebuild); the next push connects to the new holder.
  void set_backup_holder(const std::string& addr);

  SnapshotStats stats() const;
  // Joins both threads; a capture not yet copied is dropped; a state living in the slots is
  // copied back into its own memory first (the region may go away next). Idempotent.
  void stop();

  // The state lives in the region's slots (see above).
  bool in_slots() const { return in_slots_; }
  // Restores `step` from the own slot holding it by making that slot the live state,
  // copying nothing; checks layout, size and checksum first. False with the reason if the
  // slot is missing or refused (the state is then untouched). Only when in_slots().
  bool adopt(int64_t step, std::string* why);
  // Invalidates every slot holding a step after `step` (a history undone by a restore to
  // `step`), so that no survey offers it again.
  void forget_after(int64_t step);
  // The SDC checks passed on the state of `step` (the live state, committed in a slot): it is
  // copied into the region's verified slot, which keeps it until the next call, so that a
  // corruption found later rolls back to it (ckpt/snapshot_region.h); with a backup holder it
  // is pushed there too. Call on the training thread, with no copy in flight (after
  // wait_idle()). Returns the seconds it took.
  double keep_verified(int64_t step);

  // StateBanks (called by the TrainState on the training thread).
  char* bank(int i) override;
  int free_bank() const override;
  void begin_write(int i) override;
  void commit(int i, int64_t step, uint64_t checksum) override;

 private:
  struct Push {
    int slot;
    int64_t step;
    bool verified = false;  // the verified slot (keep_verified), kept apart at the holder
  };
  void copy_loop();
  void push_loop();
  bool pinned(int slot) const;       // mu_ held
  void push_verified(int64_t step);  // queues the verified slot's push, if there is a holder
  // Marks slot `i` invalid once no push reads it (dropping one not yet started); mu_ held.
  void invalidate(std::unique_lock<std::mutex>& lk, int i);

  TrainState* state_;
  SnapshotRegion* region_;
  SnapshotterOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<int64_t> capture_;        // step waiting to be (or being) copied
  std::optional<Push> pending_;           // newest committed slot not yet pushed
  std::optional<Push> pending_verified_;  // the verified slot, when it changed
  int inflight_slot_ = -1;                // slot being pushed
  std::string holder_;
  bool stop_ = false;
  bool push_error_reported_ = false;
  bool degraded_ = false;  // the last push failed
  std::string copy_error_;
  SnapshotStats stats_;
  std::unique_ptr<BackupClient> client_;  // push thread only
  bool client_degraded_ = false;          // client_ was made with the degraded timeouts
  std::thread copy_thread_, push_thread_;
  bool in_slots_ = false;
};

}  // namespace keel
