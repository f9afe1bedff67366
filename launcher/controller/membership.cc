#include "launcher/controller/membership.h"

#include <algorithm>

#include "runtime/check.h"

namespace keel {
namespace {

template <class... A>
[[noreturn]] void refuse(const A&... parts) {
  throw MembershipError(detail::concat("membership: ", parts...));
}

}  // namespace

JobMembership::JobMembership(const Topology& topo, int configured_dp, const SlotLayout& layout)
    : topo_(topo),
      configured_dp_(configured_dp),
      workers_per_slot_(layout.slots > 0 ? std::max(1, layout.workers_per_slot) : 1),
      initial_standbys_(layout.slots > 0 ? layout.standby_slots : 0),
      slots_(size_t(std::max(0, layout.slots))) {
  if (slots_.empty()) return;
  if (layout.standby_slots < 0 || layout.standby_slots >= layout.slots)
    refuse(layout.standby_slots, " standby slot(s) of ", layout.slots);
  rank_slot_.resize(size_t(world()));
  for (int r = 0; r < world(); ++r) rank_slot_[size_t(r)] = r / workers_per_slot_;
  for (int k = layout.slots - layout.standby_slots; k < layout.slots; ++k) {
    slots_[size_t(k)].role = Role::kStandby;
    slots_[size_t(k)].initial_standby = true;
  }
}

const JobMembership::Slot& JobMembership::at(int slot) const {
  if (slot < 0 || slot >= slot_count())
    refuse("slot ", slot, " is out of range 0..", slot_count() - 1);
  return slots_[size_t(slot)];
}

JobMembership::Slot& JobMembership::at(int slot) {
  return const_cast<Slot&>(static_cast<const JobMembership*>(this)->at(slot));
}

int JobMembership::slot_of(int rank) const {
  if (!has_slots()) return -1;
  if (rank < 0 || rank >= int(rank_slot_.size())) refuse("rank ", rank, " is out of range");
  return rank_slot_[size_t(rank)];
}

std::vector<int> JobMembership::ranks_on(int slot) const {
  std::vector<int> out;
  for (size_t r = 0; r < rank_slot_.size(); ++r)
    if (rank_slot_[r] == slot) out.push_back(int(r));
  return out;
}

membership::SlotInfo::State JobMembership::state(int slot) const {
  using St = membership::SlotInfo;
  const Slot& s = at(slot);
  return s.link == Link::kLost      ? St::lost
         : s.link == Link::kPending ? St::pending
         : s.role == Role::kStandby ? St::standby
         : s.role == Role::kEvicted ? St::evicted
                                    : St::active;
}

const char* JobMembership::state_name(membership::SlotInfo::State s) {
  switch (s) {
    case membership::SlotInfo::active:
      return "active";
    case membership::SlotInfo::standby:
      return "standby";
    case membership::SlotInfo::evicted:
      return "evicted";
    case membership::SlotInfo::lost:
      return "lost";
    case membership::SlotInfo::pending:
      return "pending";
    default:
      return "unknown";
  }
}

JobMembership::Registered JobMembership::register_slot(int slot) {
  Slot& s = at(slot);
  Registered out;
  out.rejoined = s.link == Link::kLost || s.role == Role::kEvicted;
  s.link = Link::kUp;
  // A slot whose ranks moved elsewhere comes back as a standby, after its self-check.
  if (s.role == Role::kEvicted || (out.rejoined && ranks_on(slot).empty())) s.role = Role::kStandby;
  out.start_check = s.role == Role::kStandby;
  return out;
}

void JobMembership::heartbeat_lost(int slot) {
  Slot& s = at(slot);
  if (s.link != Link::kUp)
    refuse("slot ", slot, " cannot be lost: it is ", state_name(state(slot)));
  s.link = Link::kLost;
}

int JobMembership::begin_standby_check(int slot) {
  Slot& s = at(slot);
  if (s.link != Link::kUp || s.role != Role::kStandby)
    refuse("slot ", slot, " cannot check itself as a standby: it is ", state_name(state(slot)));
  s.ready = false;
  s.check_failed = false;
  return ++s.gen;
}

bool JobMembership::standby_checked(int slot, int gen, bool ok) {
  Slot& s = at(slot);
  if (s.role != Role::kStandby)
    refuse("slot ", slot, " is no standby (", state_name(state(slot)), "): no self-check to take");
  if (gen != s.gen) return false;
  s.ready = ok;
  s.check_failed = !ok;
  return true;
}

void JobMembership::evict(int slot) {
  Slot& s = at(slot);
  if (s.role == Role::kStandby) refuse("slot ", slot, " is a standby: it holds no ranks to evict");
  s.role = Role::kEvicted;
  s.ready = false;
}

std::vector<int> JobMembership::promote(int slot, int standby) {
  Slot& from = at(slot);
  const Slot& to = at(standby);
  if (to.link != Link::kUp || to.role != Role::kStandby || !to.ready)
    refuse("standby slot ", standby, " is no longer ready (", state_name(state(standby)), ")");
  const std::vector<int> moved = ranks_on(slot);
  if (moved.empty()) refuse("slot ", slot, " holds no ranks to hand to standby slot ", standby);
  if (int(moved.size()) > workers_per_slot_)
    refuse("slot ", slot, " holds ", moved.size(), " ranks, more than a slot's ",
           workers_per_slot_);
  for (int r : moved) rank_slot_[size_t(r)] = standby;
  at(standby).role = Role::kActive;
  at(standby).ready = false;
  // A live slot evicted a moment ago has registered again and checks itself as a standby by
  // now: it must stay one. Only a slot still holding the role is marked.
  if (from.role == Role::kActive) from.role = Role::kEvicted;
  return moved;
}

void JobMembership::renumber(const std::map<int, int>& old_to_new, const Topology& next) {
  std::vector<int> slot(size_t(next.world_size()), -1);
  std::vector<bool> taken(size_t(next.world_size()), false);
  for (const auto& [o, n] : old_to_new) {
    if (o < 0 || o >= world()) refuse("renumber: old rank ", o, " is out of range");
    if (n < 0 || n >= next.world_size()) refuse("renumber: new rank ", n, " is out of range");
    if (taken[size_t(n)]) refuse("renumber: two ranks would become rank ", n);
    taken[size_t(n)] = true;
    if (has_slots()) slot[size_t(n)] = rank_slot_[size_t(o)];
  }
  topo_ = next;
  if (has_slots()) rank_slot_ = std::move(slot);
}

int JobMembership::placeable() const {
  int ready = 0;
  for (int k = 0; k < slot_count(); ++k)
    if (state(k) == membership::SlotInfo::standby && slots_[size_t(k)].ready) ++ready;
  return ready * workers_per_slot_;
}

std::vector<JobMembership::Placement> JobMembership::place(const std::vector<int>& ranks) {
  std::vector<int> ready;
  for (int k = 0; k < slot_count(); ++k)
    if (state(k) == membership::SlotInfo::standby && slots_[size_t(k)].ready) ready.push_back(k);
  if (int(ready.size()) * workers_per_slot_ < int(ranks.size()))
    refuse(ranks.size(), " new rank(s) need more than the ", ready.size(),
           " ready standby slot(s)");
  for (int r : ranks)
    if (r < 0 || r >= int(rank_slot_.size())) refuse("place: rank ", r, " is out of range");
  std::vector<Placement> out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int k = ready[i / size_t(workers_per_slot_)];
    rank_slot_[size_t(ranks[i])] = k;
    slots_[size_t(k)].role = Role::kActive;
    slots_[size_t(k)].ready = false;
    out.push_back({ranks[i], k, int(i % size_t(workers_per_slot_))});
  }
  return out;
}

void JobMembership::next_epoch(int next) {
  if (next != epoch_ + 1) refuse("epoch ", next, " cannot follow epoch ", epoch_);
  epoch_ = next;
}

policy::ClusterView JobMembership::view() const {
  policy::ClusterView v;
  v.topo = topo_;
  v.configured_dp = configured_dp_;
  v.workers_per_slot = workers_per_slot_;
  v.rank_slot = rank_slot_;
  for (int k = 0; k < slot_count(); ++k) {
    const membership::SlotInfo::State st = state(k);
    v.slots[k] = st;
    if (st != membership::SlotInfo::standby) continue;
    if (slots_[size_t(k)].ready)
      v.ready_standbys.insert(k);
    else if (!slots_[size_t(k)].check_failed)  // a failed self-check is not worth waiting for
      v.pending_standbys.insert(k);
  }
  return v;
}

membership::Membership JobMembership::to_proto() const {
  membership::Membership m;
  m.set_epoch(epoch_);
  m.set_tp(topo_.tp());
  m.set_pp(topo_.pp());
  m.set_dp(topo_.dp());
  for (int s : rank_slot_) m.add_rank_slot(s);
  for (int k = 0; k < slot_count(); ++k) {
    membership::SlotInfo* si = m.add_slots();
    si->set_slot(k);
    si->set_state(state(k));
    const Slot& sl = slots_[size_t(k)];
    si->set_ready(state(k) == membership::SlotInfo::standby && sl.ready);
    si->set_role(sl.role == Role::kStandby   ? membership::SlotInfo::role_standby
                 : sl.role == Role::kEvicted ? membership::SlotInfo::role_evicted
                                             : membership::SlotInfo::role_active);
    si->set_standby_gen(sl.gen);
    si->set_initial_standby(sl.initial_standby);
    si->set_check_failed(sl.check_failed);
  }
  return m;
}

JobMembership JobMembership::restore(const membership::Membership& m, int configured_dp,
                                     const SlotLayout& layout) {
  JobMembership j(Topology(std::max(1, m.tp()), std::max(1, m.pp()), std::max(1, m.dp())),
                  configured_dp, layout);
  if (m.slots_size() != j.slot_count() || m.rank_slot_size() != int(j.rank_slot_.size()))
    refuse("the stored membership (", m.slots_size(), " slots, ", m.rank_slot_size(),
           " ranks) is not this job's (", j.slot_count(), " slots, ", j.rank_slot_.size(),
           " ranks)");
  j.restored_ = true;
  j.epoch_ = m.epoch();
  j.rank_slot_.assign(m.rank_slot().begin(), m.rank_slot().end());
  for (const membership::SlotInfo& si : m.slots()) {
    Slot& s = j.at(si.slot());
    s.link = Link::kPending;  // until its agent registers with this leader
    s.role = si.role() == membership::SlotInfo::role_standby   ? Role::kStandby
             : si.role() == membership::SlotInfo::role_evicted ? Role::kEvicted
                                                               : Role::kActive;
    s.ready = si.ready();
    s.gen = si.standby_gen();
    s.initial_standby = si.initial_standby();
    s.check_failed = si.check_failed();
  }
  return j;
}

void JobMembership::take_slots_of(const JobMembership& other) {
  if (other.slot_count() != slot_count())
    refuse("cannot take the states of ", other.slot_count(), " slots into ", slot_count());
  slots_ = other.slots_;
}

void JobMembership::rejoin_slot(int slot) {
  Slot& s = at(slot);
  if (s.link != Link::kPending)
    refuse("slot ", slot, " cannot rejoin a new leader: it is ", state_name(state(slot)));
  s.link = Link::kUp;
}

}  // namespace keel
