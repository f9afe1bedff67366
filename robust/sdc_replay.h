// Stop-time dual-phase replay (ByteRobust; DESIGN.md, Failure handling): when the in-flight
// checks cannot name a culprit (two replicas disagree, nobody fails the golden check) or an
// operator suspects corruption (keel-ctl replay, also with the checks off), the machines are
// split into groups, each big enough for one whole TP×PP pipeline, and every group replays
// the same step from the same snapshot at data parallelism 1. Healthy groups agree bit for
// bit; a group whose digest differs from the majority holds a defective machine. The groups
// are arranged twice, contiguously and then strided, so that a machine is the only one it
// shares with any group of the other arrangement: the machine in a failing group of both is
// the culprit. Pure code; launcher/controller/controller_replay.cc runs the groups.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace keel::sdc {

struct ReplayPlan {
  int slots_per_group = 0;
  // phases[0] contiguous, phases[1] strided: group -> its machines, in placement order.
  std::vector<std::vector<std::vector<int>>> phases;
  std::string why_not;  // non-empty: no replay is possible (and why)
};

// Groups over `machines` (slots that can run workers, in a fixed order), each of
// ceil(ranks_per_group / workers_per_slot) machines. Needs at least three groups: with two, a
// disagreement has no majority. Machines left over sit out.
ReplayPlan plan_replay(const std::vector<int>& machines, int ranks_per_group, int workers_per_slot);

// The groups of one phase whose digest differs from the majority's; nullopt when no digest
// is held by more than half of the groups (an empty digest, a group that failed to run,
// counts as differing).
std::optional<std::set<int>> failing_groups(const std::vector<std::string>& digests);

// Machines that are in a failing group in every phase (`failing[phase]`).
std::vector<int> replay_culprits(const ReplayPlan& plan, const std::vector<std::set<int>>& failing);

}  // namespace keel::sdc
