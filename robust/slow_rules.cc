#include "robust/slow_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

namespace keel {
namespace {

// Rounds of an epoch whose median step time makes the decline baseline: at least, at most.
constexpr int kBaselineRounds = 5, kHistoryRounds = 50;
// A slow rank or link must cost at least this share of a step to count: where ranks mostly
// wait for each other (many ranks on few cores), a rank's compute can be twice its peers' and
// still cost the job nothing that matters.
constexpr double kStepShare = 0.10;
// Flags need the figure this many robust deviations above the peers' median too, so that a
// spread-out role (a loaded machine) does not flag its slowest member every round.
constexpr double kDeviations = 3.0;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t n = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + long(n), v.end());
  if (v.size() % 2) return v[n];
  const double hi = v[n];
  std::nth_element(v.begin(), v.begin() + long(n) - 1, v.end());
  return (v[n - 1] + hi) / 2;
}

// Whether `x` is slow against `peers` by `factor`; *ratio gets x ÷ their median.
bool beyond(double x, const std::vector<double>& peers, double factor, double* ratio) {
  const double m = median(peers);
  std::vector<double> dev;
  for (double p : peers) dev.push_back(std::fabs(p - m));
  // MAD scaled to a standard deviation; never below 5% of the median, so that identical
  // peers (a MAD of 0) do not make every microsecond of noise significant.
  const double scale = std::max(1.4826 * median(dev), 0.05 * m);
  *ratio = m > 0 ? x / m : 0;
  return m > 0 && x >= factor * m && x - m >= kDeviations * scale;
}

void push(std::deque<bool>* d, bool v, int window) {
  d->push_back(v);
  while (int(d->size()) > window) d->pop_front();
}

int count(const std::deque<bool>& d) {
  return int(std::count(d.begin(), d.end(), true));
}

std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f", s * 1000);
  return b;
}

std::string times(double f) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2fx", f);
  return b;
}

}  // namespace

const char* slow_kind_name(SlowVerdict::Kind kind) {
  switch (kind) {
    case SlowVerdict::Kind::kSlowRank:
      return "slow";
    case SlowVerdict::Kind::kSlowLink:
      return "slow_link";
    case SlowVerdict::Kind::kMfuDecline:
      return "mfu_decline";
    case SlowVerdict::Kind::kNone:
      break;
  }
  return "";
}

SlowDetector::SlowDetector(const config::DetectConfig& dc)
    : factor_(dc.slow_factor()),
      decline_factor_(dc.decline_factor()),
      need_(dc.slow_rounds()),
      window_(dc.slow_window()) {}

void SlowDetector::reset() {
  judged_ = 0;
  compute_flags_.clear();
  link_flags_.clear();
  last_factor_.clear();
  step_s_.clear();
  window_s_.clear();
  decline_flags_.clear();
}

void SlowDetector::forget(int rank) {
  compute_flags_.erase(rank);
  link_flags_.erase(rank);
}

SlowVerdict SlowDetector::observe(const Topology& topo,
                                  const std::map<int, control::RoundStats>& ranks) {
  SlowVerdict v;
  const int world = topo.world_size();
  if (int(ranks.size()) < world) return v;
  auto per_step = [](const control::RoundStats& r, double x) {
    return r.steps() > 0 ? x / r.steps() : 0.0;
  };
  std::vector<double> compute(static_cast<size_t>(world)), step(static_cast<size_t>(world));
  for (const auto& [r, rs] : ranks) {
    if (r < 0 || r >= world) return v;
    compute[size_t(r)] = per_step(rs, rs.compute_s());
    step[size_t(r)] = per_step(rs, rs.wall_s());
  }
  // The round's figures, for the incident and the progress line.
  v.figures = "compute ms/step:";
  for (int r = 0; r < world; ++r)
    v.figures += " r" + std::to_string(r) + " " + ms(compute[size_t(r)]);
  const double step_s = median(step);
  v.figures += "; step " + ms(step_s) + " ms";

  // Compute, against the ranks of the same stage (the job's others when the stage is small).
  std::set<int> slow_compute;
  std::map<int, double> compute_ratio;
  for (int r = 0; r < world; ++r) {
    std::vector<double> peers;
    for (int q = 0; q < world; ++q)
      if (q != r && topo.coord(q).pp == topo.coord(r).pp) peers.push_back(compute[size_t(q)]);
    if (peers.size() < 2) {
      peers.clear();
      for (int q = 0; q < world; ++q)
        if (q != r) peers.push_back(compute[size_t(q)]);
    }
    double ratio = 0;
    if (beyond(compute[size_t(r)], peers, factor_, &ratio) &&
        compute[size_t(r)] - median(peers) >= kStepShare * step_s)
      slow_compute.insert(r);
    compute_ratio[r] = ratio;
    if (ratio > v.slowest_factor) {
      v.slowest_factor = ratio;
      v.slowest = r;
    }
  }

  // Links, against the job's links of the same group kind.
  struct Link {
    int from, to;
    double per_msg, msgs_per_step;
  };
  std::map<std::string, std::vector<Link>> links;
  for (const auto& [r, rs] : ranks)
    for (const control::LinkRound& l : rs.links())
      if (l.sends() > 0)
        links[l.group()].push_back({r, l.peer(), l.send_seconds() / double(l.sends()),
                                    double(l.sends()) / std::max(1, rs.steps())});
  std::map<int, int> endpoint_hits;
  std::map<int, double> link_ratio;
  int slow_links = 0;
  for (auto& [group, ls] : links) {
    for (size_t i = 0; i < ls.size(); ++i) {
      std::vector<double> peers;
      for (size_t j = 0; j < ls.size(); ++j)
        if (j != i) peers.push_back(ls[j].per_msg);
      if (peers.size() < 2) continue;
      double ratio = 0;
      if (!beyond(ls[i].per_msg, peers, factor_, &ratio)) continue;
      // msgs/step × the excess per message, against the step.
      const double excess = (ls[i].per_msg - median(peers)) * ls[i].msgs_per_step;
      if (step_s <= 0 || excess < kStepShare * step_s) continue;
      // A receiver that is busy computing fills the sender's socket: its slowness, not the
      // link's.
      if (slow_compute.count(ls[i].to) || slow_compute.count(ls[i].from)) continue;
      ++slow_links;
      for (int end : {ls[i].from, ls[i].to}) {
        ++endpoint_hits[end];
        link_ratio[end] = std::max(link_ratio[end], ratio);
      }
    }
  }
  // The cause of the slow links is the rank common to most of them.
  std::set<int> slow_link_ranks;
  int best = 0;
  for (const auto& [r, hits] : endpoint_hits) best = std::max(best, hits);
  if (best > 0)
    for (const auto& [r, hits] : endpoint_hits)
      if (hits == best && (hits == slow_links || hits > 1 || slow_links == 1))
        slow_link_ranks.insert(r);
  // Two endpoints of a single slow link tie: the sender's own sends are slow, so it is the
  // one (a busy receiver was excluded above).
  if (slow_link_ranks.size() > 1 && slow_links == 1) {
    for (auto& [group, ls] : links)
      for (const Link& l : ls)
        if (slow_link_ranks.count(l.from) && slow_link_ranks.count(l.to)) {
          slow_link_ranks = {l.from};
          break;
        }
  }

  ++judged_;
  if (judged_ == 1) return v;  // the epoch's first round warms up: not judged
  for (int r = 0; r < world; ++r) {
    push(&compute_flags_[r], slow_compute.count(r) > 0, window_);
    push(&link_flags_[r], slow_link_ranks.count(r) > 0, window_);
  }
  for (int r = 0; r < world; ++r) {
    if (count(compute_flags_[r]) < need_) continue;
    v.kind = SlowVerdict::Kind::kSlowRank;
    v.rank = r;
    v.factor = compute_ratio[r];
    v.detail = "rank " + std::to_string(r) + " computes " + times(v.factor) +
               " the median of its pipeline stage (" + ms(compute[size_t(r)]) +
               " ms per step) in " + std::to_string(count(compute_flags_[r])) + " of the last " +
               std::to_string(compute_flags_[r].size()) + " rounds";
    return v;
  }
  for (int r = 0; r < world; ++r) {
    if (count(link_flags_[r]) < need_) continue;
    v.kind = SlowVerdict::Kind::kSlowLink;
    v.rank = r;
    v.factor = link_ratio.count(r) ? link_ratio[r] : 0;
    v.detail = "the links of rank " + std::to_string(r) + " take " + times(v.factor) +
               " the median time per message of their group kind in " +
               std::to_string(count(link_flags_[r])) + " of the last " +
               std::to_string(link_flags_[r].size()) + " rounds";
    return v;
  }

  // The job as a whole: a sustained decline that no rank explains, against the median of
  // the rounds before the window (up to kHistoryRounds of them), so that a slow drift of the
  // machine's speed moves the baseline and only a step change stands out.
  const bool anyone = !slow_compute.empty() || !slow_link_ranks.empty();
  if (int(step_s_.size()) >= kBaselineRounds) {
    const double baseline = median(std::vector<double>(step_s_.begin(), step_s_.end()));
    push(&decline_flags_, !anyone && step_s >= decline_factor_ * baseline, window_);
    if (count(decline_flags_) >= need_) {
      v.kind = SlowVerdict::Kind::kMfuDecline;
      v.factor = step_s / baseline;
      v.detail = "the job's step time is " + times(v.factor) + " its baseline (" + ms(step_s) +
                 " ms against " + ms(baseline) + " ms) in " +
                 std::to_string(count(decline_flags_)) + " of the last " +
                 std::to_string(decline_flags_.size()) + " rounds, and no rank stands out";
      // The new level is the baseline from now on: one incident per decline.
      step_s_.clear();
      decline_flags_.clear();
      return v;
    }
  }
  // The window's rounds join the baseline only once they leave the window.
  window_s_.push_back(step_s);
  if (int(window_s_.size()) > window_) {
    step_s_.push_back(window_s_.front());
    window_s_.pop_front();
    while (int(step_s_.size()) > kHistoryRounds) step_s_.pop_front();
  }
  return v;
}

}  // namespace keel
