#include "robust/raft_leader_place.h"

namespace keel {

int raft_leader_home(const std::vector<RaftMemberView>& members, int controller_slot) {
  int home = -1;
  for (const RaftMemberView& m : members)
    if (m.slot != controller_slot && m.slot > home) home = m.slot;
  return home;
}

RaftLeaderMove raft_leader_move(const std::vector<RaftMemberView>& members, int controller_slot) {
  RaftLeaderMove no;
  const int home = raft_leader_home(members, controller_slot);
  if (home < 0) {
    no.why_not = "no member outside the controller's slot";
    return no;
  }
  // Every member up and answering, all behind one leader of one term: a member that is down,
  // silent or electing could be the target, or the leader could be about to change anyway.
  const RaftMemberView* target = nullptr;
  const RaftMemberView* leader = nullptr;
  for (const RaftMemberView& m : members) {
    if (m.id == 0 || !m.slot_up || !m.answered) {
      no.why_not = "the member on slot " + std::to_string(m.slot) + " is down or silent";
      return no;
    }
    if (m.leader_id == 0 || m.leader_id != members.front().leader_id ||
        m.raft_term != members.front().raft_term) {
      no.why_not = "the members do not follow one leader (an election)";
      return no;
    }
    if (m.slot == home) target = &m;
    if (m.id == m.leader_id) leader = &m;
  }
  if (!leader) {
    no.why_not = "the leader is not among the job's members";
    return no;
  }
  if (leader == target) {
    no.why_not = "in place";
    return no;
  }
  if (target->raft_index + kRaftMoveMaxLag < leader->raft_index) {
    no.why_not = "the member on slot " + std::to_string(home) + " is behind the leader";
    return no;
  }
  return RaftLeaderMove{leader->id, target->id, home, ""};
}

}  // namespace keel
