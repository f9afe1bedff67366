// How a rank moves from epoch to epoch (DESIGN.md, Recovery protocol). It joins an epoch: the
// controller's Rebuild taken, the communicators built in a rendezvous the controller can
// abort (the recovery watcher aborts them the moment abort/<E+1> appears), the rank's state
// loaded, restored/<E>/<rank> set. When the epoch fails, while it is being built (a peer died
// in the rendezvous) or in a step, it reports the failure, waits for the controller's
// decision (RecoveryClient) and joins the next epoch. The order and the protocol are this
// class's; what a rank does at each point is the worker's, given as Steps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "launcher/worker/epoch_groups.h"
#include "launcher/worker/recovery_client.h"
#include "proto/membership.pb.h"

namespace keel {

class EpochRunner {
 public:
  struct Steps {
    // Takes the epoch's Rebuild before its communicators: a new rank id, the Membership,
    // the plugin.
    std::function<void(const membership::Rebuild& rb)> take_rebuild;
    // What peers read during the rendezvous (the backup server's address). May be empty.
    std::function<void()> before_rendezvous;
    // Makes the epoch's groups (epoch() is the new epoch's); `wrap` and `rebind` as
    // EpochGroups::build takes them (may be empty).
    EpochGroups::Make make_groups;
    std::function<void(ProcessGroups&)> wrap;
    std::function<void(ProcessGroups*)> rebind;
    // The groups stand: the rank's state for the epoch (`rb` null: the job's start state).
    std::function<void(const membership::Rebuild* rb)> load;
    // The rank's steps completed (what it acknowledges an abort with).
    std::function<int64_t()> steps_done;
  };

  explicit EpochRunner(Steps steps) : steps_(std::move(steps)) {}

  // The rank's side of the recovery protocol; null (a rank without a controller): a failure
  // is thrown to the caller.
  void set_recovery(RecoveryClient* recovery) { recovery_ = recovery; }

  // The epoch the rank is in (or is joining).
  int epoch() const { return epoch_; }
  EpochGroups& groups() { return groups_; }

  // Joins `epoch` with its Rebuild `rb` (null: the job's start). An epoch that fails while
  // it is being built (a CommError) is reported, and the rank joins the next one the
  // controller decides on, until one stands.
  void join(int epoch, const membership::Rebuild* rb);
  // A step failed in a way that ends the epoch (a CommError or a RecoverableFailure): aborts
  // the groups, so that peers blocked on this rank learn at once, runs `settle` (the
  // snapshot in flight settles, so that the controller reads stable slots), reports the
  // failure of step `step` (`what`), waits for the decision and joins the next epoch.
  // Needs the recovery client.
  void fail(int64_t step, const std::string& what, const std::function<void()>& settle);

 private:
  Steps steps_;
  RecoveryClient* recovery_ = nullptr;
  int epoch_ = 0;
  EpochGroups groups_;
};

}  // namespace keel
