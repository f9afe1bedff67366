// A rank's side of the recovery protocol (launcher/recovery_protocol.h): a watcher thread
// that aborts the rank's communicators the moment the supervisor starts a new epoch
// (abort/<E>), and the calls a rank makes after a failure to be told which step to restore:
// error/<E>/<rank> (store::RankError) and errors/<E>, ack/<E>/<rank> (membership::Ack), the
// decision rebuild/<E> (membership::Rebuild), restored/<E>/<rank> (store::Time) and
// restored_from/<E>/<rank> (store::Restored).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "parallel/store.h"
#include "proto/membership.pb.h"

namespace keel {

// This process was taken out of the job while it could not be heard (its machine cut off,
// then back): the epoch it would join runs its ranks on other slots. It must not take part:
// its rank's other self is already there. Thrown by fail_and_wait; the process ends.
class RankSuperseded : public Error {
 public:
  using Error::Error;
};

// Whether `rb` gives `slot` no rank (the slot was lost or evicted): a worker of that slot
// that wakes up in it is a stale one. False without slots (keel-worker --nproc).
bool slot_left_out(const membership::Rebuild& rb, int slot);

class RecoveryClient {
 public:
  // `connect` makes a new store client: the watcher blocks in get() on a connection of its
  // own, since a TcpStore serialises calls and would hold up the rank's rendezvous.
  // `slot`: the rank's machine slot (-1: none, keel-worker --nproc).
  RecoveryClient(std::function<std::shared_ptr<Store>()> connect, int rank, int slot = -1);
  ~RecoveryClient();
  RecoveryClient(const RecoveryClient&) = delete;
  RecoveryClient& operator=(const RecoveryClient&) = delete;

  // Watches for abort(epoch + 1) and calls on_abort (from the watcher thread) once it comes.
  // Replaces any earlier watch.
  void watch(int epoch, std::function<void()> on_abort);
  void stop_watch();

  // After a CommError in `epoch`: reports it (unless the supervisor already called the
  // abort), waits for the abort, acknowledges with this rank's steps completed and the step
  // in flight, and waits for the controller's decision for epoch + 1 (membership, restore
  // step and where it comes from). Throws RankSuperseded, without acknowledging, when that
  // decision leaves this rank's slot out (slot_left_out).
  membership::Rebuild fail_and_wait(int epoch, int64_t steps_completed, int64_t step_in_flight,
                                    const std::string& what);
  // A restarted rank: waits for the decision of `epoch`.
  membership::Rebuild wait_rebuild(int epoch);
  // This rank restored its state in `epoch` (restored/<E>/<rank>: store::Time, now).
  void mark_restored(int epoch);
  // Where this rank's state of `epoch` came from (restored_from/<E>/<rank>, for the
  // incident's rank_sources).
  void restored_from(int epoch, membership::Source source);

  Store& store() { return *store_; }
  // The rank's id changed (the job shrank or grew its data parallelism).
  void set_rank(int rank) { rank_ = rank; }
  int rank() const { return rank_; }

 private:
  std::function<std::shared_ptr<Store>()> connect_;
  int rank_;
  int slot_;
  std::shared_ptr<Store> store_;
  std::thread watcher_;
  std::atomic<bool> stop_{false};
  std::atomic<int> aborted_epoch_{-1};
};

}  // namespace keel
