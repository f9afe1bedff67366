// The 3-D layout of a job: which (dp, pp, tp) coordinate each global rank holds and which
// ranks share a group. Order is Megatron-LM's default: TP varies fastest, then DP, then PP,
// so rank = tp + dp·TP + pp·TP·DP and a TP group is a run of adjacent ranks (one machine).
#pragma once

#include <string>
#include <vector>

namespace keel {

struct Coord {
  int dp = 0, pp = 0, tp = 0;
  bool operator==(const Coord&) const = default;
};

class Topology {
 public:
  // Throws keel::InputError if a size is < 1.
  Topology(int tp, int pp, int dp);

  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int world_size() const { return tp_ * pp_ * dp_; }
  bool operator==(const Topology&) const = default;

  Coord coord(int rank) const;
  int rank(Coord c) const;

  // Global ranks of the group containing `rank`, ordered by their coordinate along the
  // group's axis (so a rank's index in the list is its rank within the group).
  std::vector<int> tp_group(int rank) const;
  std::vector<int> pp_group(int rank) const;
  std::vector<int> dp_group(int rank) const;
  // First and last pipeline stage of the rank's (dp, tp) column; one rank when pp == 1.
  std::vector<int> embedding_group(int rank) const;

  // A stable name for the group of that kind containing `rank`, e.g. "tp.dp1.pp0", used in
  // rendezvous keys so that the members of one group meet and nobody else.
  std::string tp_group_name(int rank) const;
  std::string pp_group_name(int rank) const;
  std::string dp_group_name(int rank) const;
  std::string embedding_group_name(int rank) const;

 private:
  int tp_, pp_, dp_;
};

}  // namespace keel
