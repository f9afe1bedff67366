// The communicators of a rank's current epoch (TP, PP, DP, embedding and world groups), which
// two threads touch: the step loop uses them, and the recovery watcher aborts them from its
// own thread the moment the controller starts the next epoch, the rendezvous of a new epoch
// included (so a rank never waits for a peer that is gone).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>

#include "parallel/process_groups.h"

namespace keel {

class EpochGroups {
 public:
  // Makes the groups of an epoch; the rendezvous ends early (CommAborted) once `cancel` is set.
  using Make = std::function<ProcessGroups(const std::atomic<bool>* cancel)>;

  // A new epoch is being built: a cancel left from the last one is cleared.
  void begin() { cancel_ = false; }
  // Any thread: aborts the groups in use and the rendezvous of the next ones.
  void abort();
  // Builds the epoch's groups with `make` (outside the lock: a rendezvous takes time) and
  // installs them; `rebind` is called under the lock with the new groups (the Trainer takes
  // them), so that an abort never meets a half-switched rank.
  ProcessGroups& build(const Make& make, const std::function<void(ProcessGroups&)>& wrap,
                       const std::function<void(ProcessGroups*)>& rebind);

  ProcessGroups* get() const { return groups_.get(); }
  ProcessGroups& operator*() const { return *groups_; }
  ProcessGroups* operator->() const { return groups_.get(); }

 private:
  std::unique_ptr<ProcessGroups> groups_;
  std::mutex mu_;  // the recovery watcher aborts groups_ from its thread
  std::atomic<bool> cancel_{false};
};

}  // namespace keel
