#include "robust/hang_rules.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "parallel/traced_communicator.h"
#include "runtime/check.h"

namespace keel {
namespace {

constexpr int kGroupCount = kCommGroups;
// Where to look for a rank's culprit group: the narrowest first, so a detail names the
// group whose peers are really held up (a tp stall also holds the world metrics back).
constexpr std::array<CommGroup, kCommGroups> kNarrowestFirst = {
    CommGroup::kTp, CommGroup::kPp, CommGroup::kDp, CommGroup::kEmb, CommGroup::kWorld};

// The group's name in reports: "world", "tp", "pp", "dp", "emb".
std::string group_name(int g) {
  return comm_group_name(CommGroup(g));
}

struct Seq {
  int64_t entered = 0, finished = 0;
};

// One rank's reported counts, by group index (zeros for a group it did not report).
std::array<Seq, kGroupCount> seqs_of(const control::WorkerProgress& p) {
  std::array<Seq, kGroupCount> out{};
  for (const auto& g : p.groups())
    for (int i = 0; i < kGroupCount; ++i)
      if (g.group() == group_name(i)) out[size_t(i)] = {g.entered(), g.finished()};
  return out;
}

// The other members of `rank`'s group `g`.
std::vector<int> peers_of(const Topology& topo, int rank, int g) {
  std::vector<int> members;
  switch (CommGroup(g)) {
    case CommGroup::kWorld:
      for (int r = 0; r < topo.world_size(); ++r) members.push_back(r);
      break;
    case CommGroup::kTp:
      members = topo.tp_group(rank);
      break;
    case CommGroup::kPp:
      members = topo.pp_group(rank);
      break;
    case CommGroup::kDp:
      members = topo.dp_group(rank);
      break;
    case CommGroup::kEmb:
      members = topo.embedding_group(rank);
      break;
  }
  // A middle pipeline stage is in no embedding group: it has no peers there.
  if (std::find(members.begin(), members.end(), rank) == members.end()) return {};
  members.erase(std::remove(members.begin(), members.end(), rank), members.end());
  return members;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

std::string plural(size_t n, const std::string& one, const std::string& many) {
  return n == 1 ? one : many;
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

}  // namespace

const char* hang_rule_name(HangRule rule) {
  switch (rule) {
    case HangRule::kLiveness:
      return "liveness";
    case HangRule::kCollectiveSequence:
      return "collective_sequence";
    case HangRule::kNotInCollective:
      return "not_in_collective";
    case HangRule::kNone:
      break;
  }
  return "none";
}

std::string format_ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

bool hang_possible(double oldest_report_s, double stalled_s, double liveness_timeout_s,
                   double hang_grace_s) {
  return oldest_report_s > liveness_timeout_s || (hang_grace_s > 0 && stalled_s >= hang_grace_s);
}

HangVerdict find_hang(const HangSnapshot& s) {
  const Topology& topo = s.topology;
  const int world = topo.world_size();
  KEEL_CHECK(int(s.ranks.size()) == world, "a hang snapshot of ", s.ranks.size(),
             " ranks for a topology of ", world);
  HangVerdict v;
  auto ranks_where = [&](auto pred) {
    std::vector<int> out;
    for (int r = 0; r < world; ++r)
      if (pred(s.ranks[size_t(r)])) out.push_back(r);
    return out;
  };

  // A dead agent is a slot loss: its ranks' silence says nothing about a hang.
  if (auto dead = ranks_where([](const HangSnapshot::Rank& r) { return !r.agent_alive; });
      !dead.empty()) {
    v.detail = plural(dead.size(), "the agent of rank ", "the agents of ranks ") +
               format_ranks(dead) + plural(dead.size(), " is", " are") +
               " gone: a slot loss, not a hang";
    return v;
  }
  if (auto silent = ranks_where([](const HangSnapshot::Rank& r) { return !r.reported; });
      !silent.empty()) {
    v.detail = plural(silent.size(), "rank ", "ranks ") + format_ranks(silent) +
               plural(silent.size(), " has", " have") + " not reported in this epoch yet";
    return v;
  }
  int64_t min_step = INT64_MAX;
  for (const auto& r : s.ranks) min_step = std::min(min_step, r.last.step());
  if (min_step <= s.epoch_start_step) {
    v.detail = "no step done in this epoch yet (ranks rebuild and restore)";
    return v;
  }
  // After the last step rank 0 writes the report while the others wait in a barrier.
  if (s.steps > 0 && min_step >= s.steps) {
    v.detail = "the job's last step is done";
    return v;
  }

  // (a) liveness: the reporter thread stops only when the whole process does.
  auto stale =
      ranks_where([&](const HangSnapshot::Rank& r) { return r.age_s > s.liveness_timeout_s; });
  if (!stale.empty()) {
    std::vector<std::string> ages;
    for (int r : stale) ages.push_back(seconds(s.ranks[size_t(r)].age_s));
    v.culprits = stale;
    v.rule = HangRule::kLiveness;
    v.detail = stale.size() == 1
                   ? "rank " + std::to_string(stale[0]) + " stopped reporting " + ages[0] +
                         " ago while its agent is alive (frozen)"
                   : "ranks " + format_ranks(stale) + " stopped reporting (" + join(ages, ", ") +
                         " ago) while their agents are alive (frozen)";
    return v;
  }

  // The sequence rules need a stall: a slow step is not a hang.
  if (s.hang_grace_s <= 0) return v;
  const double threshold = 2 * s.median_step_s + s.hang_grace_s;
  if (s.stalled_s < threshold) return v;

  std::vector<std::array<Seq, kGroupCount>> seq;
  for (const auto& r : s.ranks) seq.push_back(seqs_of(r.last));

  // (b) collective_sequence: inside #n while a peer already finished #n.
  std::vector<std::string> lines;
  for (int x = 0; x < world; ++x) {
    for (CommGroup cg : kNarrowestFirst) {
      const int g = int(cg);
      const int64_t n = seq[size_t(x)][size_t(g)].entered;
      if (n <= 0) continue;
      std::vector<int> done;
      for (int p : peers_of(topo, x, g))
        if (seq[size_t(p)][size_t(g)].finished >= n) done.push_back(p);
      if (done.empty()) continue;
      v.culprits.push_back(x);
      lines.push_back("rank " + std::to_string(x) + " is still inside " + group_name(g) +
                      " collective #" + std::to_string(n) + ", which its " + group_name(g) +
                      plural(done.size(), " peer ", " peers ") + format_ranks(done) + " finished");
      break;  // one group names the rank
    }
  }
  if (!v.culprits.empty()) {
    v.rule = HangRule::kCollectiveSequence;
    v.detail = join(lines, "; ");
    return v;
  }

  // (c) not_in_collective: outside every call, behind the collective its peers wait in.
  const auto waiting =
      ranks_where([](const HangSnapshot::Rank& r) { return r.last.in_collective(); });
  const auto idle =
      ranks_where([](const HangSnapshot::Rank& r) { return !r.last.in_collective(); });
  for (int x : idle) {
    for (CommGroup cg : kNarrowestFirst) {
      const int g = int(cg);
      const int64_t done = seq[size_t(x)][size_t(g)].finished;
      std::vector<int> waiters;
      int64_t n = INT64_MAX;
      for (int p : peers_of(topo, x, g)) {
        const int64_t e = seq[size_t(p)][size_t(g)].entered;
        if (e > done) {
          waiters.push_back(p);
          n = std::min(n, e);
        }
      }
      if (waiters.empty()) continue;
      v.culprits.push_back(x);
      lines.push_back("rank " + std::to_string(x) + " has not entered " + group_name(g) +
                      " collective #" + std::to_string(n) + ", which its " + group_name(g) +
                      plural(waiters.size(), " peer ", " peers ") + format_ranks(waiters) +
                      plural(waiters.size(), " waits", " wait") + " in");
      break;
    }
  }
  if (!v.culprits.empty()) {
    v.rule = HangRule::kNotInCollective;
    v.detail = join(lines, "; ") + " (" + plural(waiting.size(), "rank ", "ranks ") +
               format_ranks(waiting) + " wait in communicator calls)";
    return v;
  }
  // Only point-to-point waits explain the stall (a pipeline whose stages have no
  // collective in common): the one rank outside every call is the one they wait for.
  if (!waiting.empty() && idle.size() == 1) {
    v.culprits = idle;
    v.rule = HangRule::kNotInCollective;
    v.detail = "rank " + std::to_string(idle[0]) +
               " is the only rank outside every communicator call while " +
               plural(waiting.size(), "rank ", "ranks ") + format_ranks(waiting) +
               plural(waiting.size(), " waits", " wait");
    return v;
  }

  // (d) no rule names a culprit: the stacks will.
  v.capture_stacks = true;
  v.detail = "the job stalled " + seconds(s.stalled_s) +
             " and no rule names a culprit: capture the workers' stacks";
  return v;
}

}  // namespace keel
