// How many members the job's own etcd has, and on which slots they run (DESIGN.md, Control
// state and failover). Raft keeps a quorum while a majority of members live: 3 members
// survive one loss, 5 survive two. A failure that takes two machines together (a top-of-rack
// switch, a power feed) is not rare at scale, so a job with the slots for it runs 5, placed so
// that one such failure takes as few of them as keel can tell: over as many failure domains
// as the slots name (`--failure-domain`, or Slurm's topology), and within that spread over the
// slot numbers (neighbouring slots are likelier to share a rack than distant ones). Pure: the
// launcher gathers each slot's domain and carries the placement out (AgentHost, EtcdUpkeep).
#pragma once

#include <string>
#include <vector>

namespace keel {

// The members a job of `slots` slots (standbys included) starts: `asked` (--etcd-members 3 or
// 5) if given, else 5 for 5 slots or more, 3 for 3 or 4. Never more than the slots, and 0 for
// jobs of 1-2 slots, which keep their control state in keel-launch's memory.
int etcd_member_count(int slots, int asked);

// The slots, ascending, that run `n` members among slots 0..domains.size()-1, where
// `domains[k]` is slot k's failure domain ("" : unknown, every such slot one domain): as many
// distinct domains as possible, as evenly shared as possible, each domain's slots and the
// domains themselves taken spread over the slot numbers. Needs 1 <= n <= domains.size().
std::vector<int> place_etcd_members(int n, const std::vector<std::string>& domains);

// The slot a lost member is replaced on, among `candidates` (live slots without a member,
// ascending): one whose domain holds the fewest of the members that stay (`kept_slots`), the
// lowest such slot; -1 when there are no candidates.
int etcd_replacement_slot(const std::vector<int>& candidates, const std::vector<int>& kept_slots,
                          const std::vector<std::string>& domains);

// What `n` members survive, for the README, the event log and the start line: "one lost
// machine" (3), "two lost machines" (5), ...
std::string etcd_members_survive(int n);

}  // namespace keel
