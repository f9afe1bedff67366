// The job's membership, owned by its controller: the epoch, the layout in force (tp, pp, dp),
// which slot each rank runs on, and each slot's state (pending, active, standby, evicted,
// lost) with its standby's readiness. Only the controller process changes it, through the
// transitions below: the epoch transition (evict, promote, renumber, place, next_epoch) and
// the AgentHost's reports of its agents (register, heartbeat lost, a standby's self-check).
// A transition that cannot happen from the state the slot is in is refused with a
// MembershipError and changes nothing. The recovery policy's ClusterView and the
// membership.Membership every Rebuild carries are both derived here, each in one function.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/topology.h"
#include "proto/membership.pb.h"
#include "robust/recovery_policy.h"

namespace keel {

// An impossible membership transition (a bug in the caller, never the job's input).
class MembershipError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// How the controller's host places ranks on machines: `slots` machines (0 without slots,
// keel-worker --nproc), the last `standby_slots` of them warm spares, `workers_per_slot`
// ranks a machine.
struct SlotLayout {
  int slots = 0;
  int standby_slots = 0;
  int workers_per_slot = 1;
};

class JobMembership {
 public:
  // A slot's connection (its agent) and its role in the job are apart: a lost slot keeps
  // its ranks until the epoch transition moves them, and a slot that rejoins keeps them when
  // nothing moved them (detect.on_slot_loss = wait).
  enum class Link { kPending, kUp, kLost };
  enum class Role { kActive, kStandby, kEvicted };

  // Epoch 0: ranks on slots in Megatron order, `workers_per_slot` consecutive ranks a slot
  // (so a TP group stays inside a slot where it fits); the last standby_slots are standbys.
  // `configured_dp`: the configured data parallelism (a shrink goes below it).
  JobMembership(const Topology& topo, int configured_dp, const SlotLayout& layout);

  int epoch() const { return epoch_; }
  const Topology& topo() const { return topo_; }
  int world() const { return topo_.world_size(); }
  int configured_dp() const { return configured_dp_; }
  int workers_per_slot() const { return workers_per_slot_; }
  int slot_count() const { return int(slots_.size()); }
  bool has_slots() const { return !slots_.empty(); }
  // -1 without slots.
  int slot_of(int rank) const;
  std::vector<int> ranks_on(int slot) const;
  Link link(int slot) const { return at(slot).link; }
  Role role(int slot) const { return at(slot).role; }
  // The slot's state as membership.proto names it (lost > pending > standby > evicted >
  // active), and as keel-ctl status prints it.
  membership::SlotInfo::State state(int slot) const;
  static const char* state_name(membership::SlotInfo::State s);
  bool ready(int slot) const { return at(slot).ready; }
  bool check_failed(int slot) const { return at(slot).check_failed; }
  // Times the slot was made a standby (names its self-check keys).
  int standby_gen(int slot) const { return at(slot).gen; }
  // Whether it was a standby from the job's start (its first check is the standbys' joint one).
  bool initial_standby(int slot) const { return at(slot).initial_standby; }
  int initial_standbys() const { return initial_standbys_; }

  // --- an agent's reports ---
  struct Registered {
    bool rejoined = false;     // it was lost or evicted
    bool start_check = false;  // it is a standby now: its workers must check themselves
  };
  // The slot's agent registered: pending/lost -> up; an evicted slot, or a lost one whose
  // ranks moved elsewhere, comes back as a standby. Refused: a slot out of range.
  Registered register_slot(int slot);
  // The slot's heartbeats stopped: up -> lost. Refused unless it is up.
  void heartbeat_lost(int slot);
  // A standby's workers are told to check themselves (again): a new generation, not ready.
  // Refused unless it is an up standby. Returns the generation.
  int begin_standby_check(int slot);
  // Generation `gen` of standby `slot` passed (ok) or failed its self-check. A result of an
  // older generation is ignored (false); refused on a slot that is no standby.
  bool standby_checked(int slot, int gen, bool ok);

  // --- the epoch transition ---
  // Takes `slot` out of the job (its workers are killed by the host): active -> evicted. A
  // slot already evicted stays so. Refused: a standby (it holds no ranks to take out).
  void evict(int slot);
  // Moves the ranks of lost or evicted `slot` onto ready standby `standby`, which becomes
  // active; `slot`, if still active, is evicted. Returns the ranks moved, in order (the i-th
  // goes to the standby's i-th parked worker). Refused: `standby` not an up, ready standby,
  // or `slot` holding no ranks.
  std::vector<int> promote(int slot, int standby);
  // The ranks got new ids under layout `next` (data parallelism shrank or grew):
  // `old_to_new` for every rank that stays; new ids not in its image are unplaced until
  // place(). Refused: an old or new id out of range, or two ranks given one id.
  void renumber(const std::map<int, int>& old_to_new, const Topology& next);
  struct Placement {
    int rank, slot, index;  // index: the parked worker on `slot` that takes it
  };
  // Puts `ranks` (a grown replica) on ready standbys, workers_per_slot a slot; they become
  // active. Refused (nothing changes): too few ready standbys.
  std::vector<Placement> place(const std::vector<int>& ranks);
  // How many ranks place() could take now.
  int placeable() const;
  // Epoch `next` begins. Refused unless next = epoch + 1.
  void next_epoch(int next);

  // The slots' states (links, roles, standby checks) of `other`, a membership of the same
  // slots: what the host saw of its agents before the controller lent it this one.
  void take_slots_of(const JobMembership& other);

  // --- a new leader controller (failover) ---
  // The membership the previous leader last wrote (etcd), every slot pending until its
  // agent registers with the new leader. Refused: a membership of another shape.
  static JobMembership restore(const membership::Membership& m, int configured_dp,
                               const SlotLayout& layout);
  // Whether it came from restore().
  bool restored() const { return restored_; }
  // The slot's agent registered with the new leader, its workers running: pending -> up,
  // its role and ranks as they were. Refused unless it is pending.
  void rejoin_slot(int slot);

  // The policy's input (robust/recovery_policy.h): the one derivation.
  policy::ClusterView view() const;
  // What every Rebuild and every command to an agent carries.
  membership::Membership to_proto() const;

 private:
  struct Slot {
    Link link = Link::kPending;
    Role role = Role::kActive;
    bool ready = false;         // a standby whose self-check of generation `gen` passed
    bool check_failed = false;  // ... or failed (not worth waiting for)
    int gen = 0;
    bool initial_standby = false;
  };
  const Slot& at(int slot) const;
  Slot& at(int slot);

  int epoch_ = 0;
  Topology topo_;
  int configured_dp_;
  int workers_per_slot_;
  int initial_standbys_;
  std::vector<int> rank_slot_;  // rank -> slot (-1: unplaced); empty without slots
  std::vector<Slot> slots_;
  bool restored_ = false;
};

}  // namespace keel
