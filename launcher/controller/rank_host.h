// Where the controller's ranks run: forked on this machine (keel-worker --nproc,
// launcher/controller/local_host.h) or on the slots' agents over the control plane
// (keel-launch, launcher/controller/agent_host.h). The controller decides and keeps the
// membership (launcher/controller/membership.h); a RankHost carries its decisions out and
// reports what happened to the ranks.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/controller/membership.h"
#include "launcher/recovery_protocol.h"
#include "parallel/topology.h"
#include "proto/control.pb.h"
#include "robust/recovery_policy.h"

namespace keel {

// A rank that ended: its wait status, or its whole slot lost (the machine died, its launcher
// was killed, or its network was cut).
struct RankExit {
  int rank = -1;
  int status = 0;          // as waitpid() gives it
  bool slot_lost = false;  // no status: the slot stopped answering
  // slot_lost: how it was found, the incident's rule: "heartbeat" (silence past
  // detect.slot_timeout_ms) or "connection_closed" (its agent's connection closed and did
  // not reopen: the process died).
  std::string lost_by = "heartbeat";
  int slot = -1;
  std::string detail;  // the last lines of its log, or why the slot is taken as lost

  bool clean() const { return !slot_lost && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  // Exits the controller must not answer with a restart: the same input or numbers would
  // fail again.
  bool fatal() const {
    return !slot_lost && WIFEXITED(status) &&
           (WEXITSTATUS(status) == recovery::kExitInputError ||
            WEXITSTATUS(status) == recovery::kExitNonFinite ||
            WEXITSTATUS(status) == recovery::kExitWriteFailed);
  }
  int code() const {
    if (slot_lost) return 1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string describe() const;
};

class RankHost {
 public:
  virtual ~RankHost() = default;
  // Starts `rank` with these environment variables (the controller's: store, job, epoch...).
  virtual void spawn(int rank, const std::map<std::string, std::string>& env) = 0;
  // SIGKILLs `rank` and returns once it is gone (its exit is not reported by poll_exit).
  virtual void kill(int rank) = 0;
  // The next rank that ended, if any; never blocks.
  virtual std::optional<RankExit> poll_exit() = 0;
  // Sends `sig` to every rank, waits up to `grace`, then SIGKILLs what is left.
  virtual void stop_all(int sig, std::chrono::milliseconds grace) = 0;
  // For each rank, the steps it could restore from snapshots that still exist: its own
  // snapshot (on the slot it runs on) and its backup holder's copy (with `replica_backups`
  // the holder's own snapshot, ckpt/backup_placement.h). Slot headers only: a restore
  // verifies what it loads.
  virtual std::map<int, policy::Holdings> survey(const Topology& topo, bool replica_backups) = 0;
  // Removes the job's shared memory (at the end of the job).
  virtual void finish() = 0;

  // The slot (machine) a rank runs on; -1 where there are no slots (--nproc).
  virtual int slot_of(int rank) const {
    (void)rank;
    return -1;
  }
  // Seconds since `slot`'s agent last sent a heartbeat (0 without slots): a silent agent
  // means the slot itself may be going, not one of its workers.
  virtual double slot_silence_s(int slot) const {
    (void)slot;
    return 0;
  }
  // The slots this host runs (none: --nproc), from which the controller builds its
  // membership; attach() lends the host that membership, which it reads for rank -> slot and
  // the slots' states and into which it reports its slots' news (registers, losses), and the
  // controller's inbox for the messages that are not the host's.
  virtual SlotLayout slot_layout() const { return {}; }
  // A control-plane message that is not the host's own (progress, keel-ctl), met while the
  // host waits on its agents: handed to the controller, which takes it up in its own loop.
  using Inbox = std::function<void(const std::string& identity, const control::Envelope& msg)>;
  virtual void attach(JobMembership* membership, Inbox inbox) {
    (void)membership;
    (void)inbox;
  }
  // Reads what the host learns lazily (standby self-checks, from the store) into the
  // membership; the controller calls it before it reads the membership to decide.
  virtual void refresh() {}
  // Keeps the job's controller candidates on live slots (keel-launch with etcd).
  virtual void keep_candidates() {}
  // A new leader controller (failover): waits up to `timeout` for every slot's agent to
  // register again with its workers running; a slot that does not is taken as lost (its
  // ranks' exits are queued for poll_exit). Returns the slots lost so.
  virtual int await_rejoin(std::chrono::milliseconds timeout) {
    (void)timeout;
    return 0;
  }
  // Adds the hosts' view (slots, their state and heartbeats) to a keel-ctl status reply.
  virtual void fill_status(control::StatusReply* reply) const { (void)reply; }
  // Hands `rank` (just moved onto a standby slot by the membership) to that slot's parked
  // worker `parked_index` when it is next spawned.
  virtual void adopt(int rank, int parked_index) {
    (void)rank;
    (void)parked_index;
  }
  // Takes `slot` out of the job (the membership has evicted it): its workers are killed
  // (their exits are not reported); it comes back as a standby once it has checked itself.
  virtual void evict(int slot) { (void)slot; }
  // The job's ranks got new ids (its data parallelism shrank or grew; the membership is
  // renumbered already): `old_to_new` for every rank that stays; ranks not in it are retired
  // (already killed).
  virtual void renumber(const std::map<int, int>& old_to_new, int new_world) {
    (void)old_to_new;
    (void)new_world;
  }
  // The ranks a slot runs now.
  virtual std::vector<int> ranks_on(int slot) const {
    (void)slot;
    return {};
  }
  // Starts a worker that is no rank of the job on `slot` (a replay worker, robust/
  // sdc_replay.h) with `env`; `id` (>= the world size) names it there (its log rank<id>.log).
  // Its exit is not reported: it answers through the store. False where there are no slots.
  virtual bool spawn_extra(int slot, int id, const std::map<std::string, std::string>& env) {
    (void)slot;
    (void)id;
    (void)env;
    return false;
  }
  // SIGKILLs such a worker if it still runs (it is not waited for).
  virtual void kill_extra(int slot, int id) {
    (void)slot;
    (void)id;
  }
  // Every thread's native stack of each running rank's worker (launcher/stack_capture.h),
  // by rank, within about `timeout` (plus the trip over the control plane). A rank whose
  // stacks could not be read, or whose slot did not answer in time, carries the reason in
  // its `error`. Empty where the host cannot capture.
  virtual std::map<int, control::RankStacks> capture_stacks(std::chrono::milliseconds timeout) {
    (void)timeout;
    return {};
  }
};

}  // namespace keel
