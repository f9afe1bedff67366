#include "robust/sdc_check.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

namespace keel::sdc {
namespace {

// A recompute pair: `checker` recomputed the first micro-batch of `target` (same (pp, tp)).
struct Pair {
  int checker, target;
};

// The recompute mismatches that matter: activation mismatches at the lowest stage with one
// (a corrupted activation spoils every stage after it, and backward brings it back to the
// stages before), else every gradient mismatch.
std::vector<Pair> mismatches(const Topology& topo, int64_t k,
                             const std::vector<RankReport>& reports, std::string* cls) {
  std::vector<Pair> grad, act;
  int lowest = topo.pp();
  if (topo.dp() < 2) return {};
  for (int r = 0; r < topo.world_size(); ++r) {
    const Coord c = topo.coord(r);
    const int x = topo.rank({recompute_target(c.dp, topo.dp(), k), c.pp, c.tp});
    const MicroBatchDigest &re = reports[size_t(r)].recomputed, &own = reports[size_t(x)].own;
    if (re.activation != own.activation) {
      act.push_back({r, x});
      lowest = std::min(lowest, c.pp);
    } else if (re.grad != own.grad) {
      grad.push_back({r, x});
    }
  }
  if (!act.empty()) {
    *cls = "activation";
    std::vector<Pair> out;
    for (const Pair& p : act)
      if (topo.coord(p.checker).pp == lowest) out.push_back(p);
    return out;
  }
  *cls = "grad";
  return grad;
}

// Pairs grouped by their (pp, tp) coordinate.
std::map<std::pair<int, int>, std::vector<Pair>> by_coordinate(const Topology& topo,
                                                               const std::vector<Pair>& pairs) {
  std::map<std::pair<int, int>, std::vector<Pair>> g;
  for (const Pair& p : pairs) {
    const Coord c = topo.coord(p.checker);
    g[{c.pp, c.tp}].push_back(p);
  }
  return g;
}

std::string ranks_text(const std::set<int>& ranks) {
  std::ostringstream o;
  const char* sep = "";
  for (int r : ranks) o << sep << r, sep = ", ";
  return o.str();
}

void name(Verdict* v, int rank, const std::string& cls, const std::string& how) {
  v->clean = false;
  if (std::find(v->culprits.begin(), v->culprits.end(), rank) == v->culprits.end())
    v->culprits.push_back(rank);
  if (v->how.empty()) {
    v->how = how;
    v->tensor_class = cls;
  }
}

void finish(Verdict* v) {
  std::ostringstream o;
  if (v->clean) {
    o << "clean";
  } else if (!v->culprits.empty()) {
    o << "rank" << (v->culprits.size() > 1 ? "s " : " ")
      << ranks_text(std::set<int>(v->culprits.begin(), v->culprits.end())) << " computed a wrong "
      << v->tensor_class << " (found by " << v->how << ")";
  } else {
    o << v->tensor_class << " digests disagree among ranks " << ranks_text(v->suspects);
    if (!v->recheck_replicas.empty())
      o << "; replicas " << ranks_text(v->recheck_replicas) << " recompute";
    else if (v->golden)
      o << "; every rank runs the golden check";
    else
      o << "; no clear culprit";
  }
  v->detail = o.str();
}

}  // namespace

bool is_check_step(int64_t step, int every) {
  return every > 0 && (step + 1) % every == 0;
}

int64_t check_index(int64_t step, int every) {
  return (step + 1) / std::max(1, every) - 1;
}

int recompute_target(int d, int dp, int64_t k) {
  if (dp < 2) return -1;
  const int offset = 1 + int(k % (dp - 1));
  return (d + offset) % dp;
}

void RankReport::pack(float* out) const {
  const uint64_t w[8] = {own.grad,
                         own.activation,
                         recomputed.grad,
                         recomputed.activation,
                         params,
                         m,
                         v,
                         uint64_t(at_rest_known) | uint64_t(at_rest_ok) << 1};
  std::memcpy(out, w, sizeof(w));
  static_assert(sizeof(w) == kFloats * sizeof(float));
}

RankReport RankReport::unpack(const float* in) {
  uint64_t w[8];
  std::memcpy(w, in, sizeof(w));
  RankReport r;
  r.own = {w[0], w[1]};
  r.recomputed = {w[2], w[3]};
  r.params = w[4];
  r.m = w[5];
  r.v = w[6];
  r.at_rest_known = w[7] & 1;
  r.at_rest_ok = (w[7] >> 1) & 1;
  return r;
}

Verdict judge(const Topology& topo, int64_t k, const std::vector<RankReport>& reports, bool zero1) {
  Verdict v;
  const int D = topo.dp();
  // Agreement, by coordinate: which field of whose state differs from its replicas'.
  std::map<int, std::string> differs;  // rank -> "param" / "optimizer"
  std::set<int> tied;
  std::string tied_class;
  if (D > 1)
    for (int p = 0; p < topo.pp(); ++p)
      for (int t = 0; t < topo.tp(); ++t) {
        std::vector<int> rs;
        for (int d = 0; d < D; ++d) rs.push_back(topo.rank({d, p, t}));
        const std::pair<const char*, uint64_t RankReport::*> fields[] = {
            {"param", &RankReport::params},
            {"optimizer", &RankReport::m},
            {"optimizer", &RankReport::v}};
        for (const auto& [cls, f] : fields) {
          if (zero1 && f != &RankReport::params) continue;
          std::map<uint64_t, int> count;
          for (int r : rs) ++count[reports[size_t(r)].*f];
          if (count.size() == 1) continue;
          auto best = std::max_element(count.begin(), count.end(),
                                       [](auto& a, auto& b) { return a.second < b.second; });
          if (best->second * 2 > D) {
            for (int r : rs)
              if (reports[size_t(r)].*f != best->first && !differs.count(r)) differs[r] = cls;
          } else {
            for (int r : rs) tied.insert(r);
            if (tied_class.empty()) tied_class = cls;
          }
        }
      }
  // At rest: the rank's own snapshot says its memory changed after the update wrote it.
  for (int r = 0; r < topo.world_size(); ++r) {
    const RankReport& rep = reports[size_t(r)];
    if (rep.at_rest_known && !rep.at_rest_ok)
      name(&v, r, differs.count(r) ? differs[r] : tied.count(r) ? tied_class : "state", "at_rest");
  }
  for (const auto& [r, cls] : differs) name(&v, r, cls, "agreement");
  // Recompute.
  std::string cls;
  const std::vector<Pair> pairs = mismatches(topo, k, reports, &cls);
  std::set<int> named(v.culprits.begin(), v.culprits.end());
  for (const auto& [coord, ps] : by_coordinate(topo, pairs)) {
    std::map<int, int> seen;
    for (const Pair& p : ps) ++seen[p.checker], ++seen[p.target];
    std::vector<int> in_all;
    for (const auto& [r, n] : seen)
      if (n == int(ps.size())) in_all.push_back(r);
    if (ps.size() >= 2 && in_all.size() == 1) {
      name(&v, in_all[0], cls, "recompute");
      continue;
    }
    // Explained by a rank already named (its state was wrong, so its gradient is too).
    bool explained = false;
    for (const auto& [r, n] : seen) explained = explained || named.count(r);
    if (explained) continue;
    v.clean = false;
    for (const auto& [r, n] : seen) v.suspects.insert(r);
    for (const Pair& p : ps) v.recheck_replicas.insert(topo.coord(p.target).dp);
    if (v.tensor_class.empty()) v.tensor_class = cls;
  }
  if (!v.culprits.empty()) {
    v.suspects.clear();
    v.recheck_replicas.clear();
  } else if (!tied.empty()) {
    v.clean = false;
    v.suspects.insert(tied.begin(), tied.end());
    if (v.recheck_replicas.empty()) {
      v.golden = true;
      v.tensor_class = tied_class;
    }
  }
  finish(&v);
  return v;
}

Verdict judge_recheck(const Topology& topo, int64_t k, const std::vector<RankReport>& reports,
                      const std::vector<MicroBatchDigest>& again, const Verdict& first) {
  Verdict v;
  v.clean = false;
  std::string cls;
  const std::vector<Pair> pairs = mismatches(topo, k, reports, &cls);
  for (const auto& [coord, ps] : by_coordinate(topo, pairs)) {
    std::set<int> disagreeing;  // checkers at odds with a target that repeats its result
    for (const Pair& p : ps) {
      const MicroBatchDigest& a = again[size_t(p.target)];
      if (a == reports[size_t(p.checker)].recomputed && !(a == reports[size_t(p.target)].own)) {
        name(&v, p.target, cls, "recompute_again");  // a flip that did not repeat
      } else if (a == reports[size_t(p.target)].own) {
        disagreeing.insert(p.checker);
      } else {
        v.suspects.insert(p.checker);  // three different answers: nobody to believe
        v.suspects.insert(p.target);
      }
    }
    // A checker alone at odds with targets that repeat themselves, and that is no target of a
    // mismatch itself (its own micro-batch was confirmed), recomputed wrongly.
    for (int c : disagreeing) {
      bool also_target = false;
      for (const Pair& p : ps) also_target = also_target || p.target == c;
      if (!also_target) {
        name(&v, c, cls, "recompute_again");
      } else {
        for (const Pair& p : ps) v.suspects.insert(p.checker), v.suspects.insert(p.target);
      }
    }
  }
  if (!v.culprits.empty()) {
    v.suspects.clear();
  } else {
    v.tensor_class = cls.empty() ? first.tensor_class : cls;
    if (v.suspects.empty()) v.suspects = first.suspects;
    v.golden = true;
  }
  finish(&v);
  return v;
}

Verdict judge_golden(const Verdict& before, const std::vector<uint64_t>& golden,
                     std::optional<uint64_t> repo) {
  Verdict v;
  v.clean = false;
  v.tensor_class = before.tensor_class;
  std::map<uint64_t, int> count;
  for (uint64_t g : golden) ++count[g];
  std::optional<uint64_t> reference;
  // The repo's digest, unless most ranks disagree with it (then the table is stale for this
  // build, not most of the machines broken).
  const int n = int(golden.size());
  if (repo && (n - count[*repo]) * 2 <= n) reference = repo;
  if (!reference)
    for (const auto& [g, c] : count)
      if (2 * c > n) reference = g;
  if (reference)
    for (int r : before.suspects)
      if (golden[size_t(r)] != *reference) name(&v, r, before.tensor_class, "golden");
  v.tensor_class = before.tensor_class;
  if (v.culprits.empty()) v.suspects = before.suspects;
  finish(&v);
  if (v.culprits.empty())
    v.detail = before.tensor_class + " digests disagree among ranks " + ranks_text(v.suspects) +
               (reference ? "; every suspect passed the golden check: no clear culprit"
                          : "; the golden check has no majority: no clear culprit");
  return v;
}

}  // namespace keel::sdc
