// Where etcd's Raft leader is kept, and whether it may be moved there now (DESIGN.md, Control
// state and failover). A member that dies while it leads costs every etcd write an election
// (1-2 s with keel's Raft timing), and a recovery makes several: a slot loss on the Raft
// leader's machine was seen taking 1.3-3 s longer than one elsewhere. So the leader is kept in
// one known place, the live member slot with the highest number that is not the controller's:
// then only that one slot's loss costs an election. Not the controller's own machine: its loss
// costs a failover, which needs etcd at once (the agents find the new leader through an etcd
// watch within the slot timeout), and both leaders lost together were seen to miss that window.
//
// A move (etcd's MoveLeader) pauses the leader's writes until the target takes over, and one
// aimed at a member that is dead, silent or behind pauses them for a whole election timeout
// (seen stalling keel's writes for their deadline). So a move is made only when every member
// answers, all of them follow one leader in one term, and the target has the leader's log.
// Pure: the caller gathers the members' answers (EtcdUpkeep) and the moments (how long since
// the last change).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace keel {

// One member of the job's etcd as the controller sees it.
struct RaftMemberView {
  uint64_t id = 0;          // etcd's member id (0: etcd does not list it)
  int slot = -1;            // the slot it runs on
  bool slot_up = false;     // its slot's agent is registered and heartbeating
  bool answered = false;    // it answered a Status call just now; then:
  uint64_t leader_id = 0;   //   the leader it follows (0: none: an election)
  uint64_t raft_term = 0;   //   its term
  uint64_t raft_index = 0;  //   its committed Raft index
};

// A decision: move the leader from `from` to `to` (on slot `to_slot`), or not (`to` = 0,
// `why_not` says why, for the log).
struct RaftLeaderMove {
  uint64_t from = 0;
  uint64_t to = 0;
  int to_slot = -1;
  std::string why_not;
};

// How far behind the leader's committed index the target may be and still be moved to: the
// leader catches it up before handing over, and a few entries take one round trip.
inline constexpr uint64_t kRaftMoveMaxLag = 16;

// The member slot the leader is kept on: the highest-numbered slot of `members` that is not
// `controller_slot` (-1: none, a cluster on the controller's machine alone).
int raft_leader_home(const std::vector<RaftMemberView>& members, int controller_slot);

// Whether to move the Raft leader now, and where.
RaftLeaderMove raft_leader_move(const std::vector<RaftMemberView>& members, int controller_slot);

}  // namespace keel
