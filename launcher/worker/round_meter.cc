#include "launcher/worker/round_meter.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

namespace keel {
namespace {

// The rank's groups in this order: names and communicators alike.
constexpr const char* kGroupNames[] = {"tp", "pp", "dp", "emb", "world"};

std::array<const Communicator*, 5> comms_of(const ProcessGroups& g) {
  return {g.tp.get(), g.pp.get(), g.dp.get(), g.emb.get(), g.world.get()};
}

constexpr size_t kMaxSamples = 8192;

report::Figures figures(std::vector<double> v, double mean) {
  report::Figures f;
  if (v.empty()) return f;
  f.set_mean(mean);
  std::sort(v.begin(), v.end());
  // Nearest rank: the smallest sample with at least p of them at or below it.
  auto at = [&](double p) {
    const size_t k = size_t(std::ceil(p * double(v.size())));
    return v[std::min(v.size() - 1, k > 0 ? k - 1 : 0)];
  };
  f.set_p50(at(0.50));
  f.set_p99(at(0.99));
  return f;
}

}  // namespace

void RoundMeter::Samples::add(double x) {
  sum += x;
  if (seen++ % stride != 0) return;
  kept.push_back(x);
  if (kept.size() < kMaxSamples) return;
  for (size_t i = 0; i < kept.size() / 2; ++i) kept[i] = kept[2 * i];
  kept.resize(kept.size() / 2);
  stride *= 2;
}

void RoundMeter::begin_step() {
  step_start_ = std::chrono::steady_clock::now();
  started_ = true;
}

double RoundMeter::step_seconds() const {
  if (!started_) return 0;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
}

void RoundMeter::new_epoch() {
  last_.clear();
  members_.clear();
  round_groups_.clear();
  round_links_.clear();
  round_.Clear();
  round_steps_done_ = 0;
  started_ = false;
}

// The step's figures, then at a round's end the round's; kept together because the round is
// made of the very sums the step adds to.
std::optional<control::RoundStats> RoundMeter::end_step(int64_t steps_completed,
                                                        const StepStats& st,
                                                        const ProcessGroups& groups,
                                                        const Topology& topo, int rank) {
  // The whole step as the loop ran it: an injected delay or a check before the Trainer's
  // clock started is this rank's time all the same.
  const double wall = std::max(st.wall_s, step_seconds());
  started_ = false;
  const double compute = std::max(0.0, wall - st.comm_s - st.bubble_s);
  compute_samples_.add(compute);
  round_.set_wall_s(round_.wall_s() + wall);
  round_.set_compute_s(round_.compute_s() + compute);
  // Who is at the other end of each group's links: fixed for an epoch, so found once.
  if (members_.empty()) {
    std::vector<int> all(size_t(topo.world_size()));
    std::iota(all.begin(), all.end(), 0);
    members_ = {topo.tp_group(rank), topo.pp_group(rank), topo.dp_group(rank),
                topo.embedding_group(rank), all};
  }
  const auto comms = comms_of(groups);
  for (size_t k = 0; k < comms.size(); ++k) {
    struct {
      const char* name;
      const Communicator* comm;
      const std::vector<int>& members;  // global ranks by group rank
    } g{kGroupNames[k], comms[k], members_[k]};
    if (!g.comm) continue;
    const CommStats cs = g.comm->stats();
    std::vector<LinkStats> links = g.comm->link_stats();
    Totals& last = last_[g.name];
    auto& rg = round_groups_[g.name];
    rg.first += cs.wait_s - last.wait_s;
    rg.second += double(cs.bytes_sent) - last.bytes;
    for (const LinkStats& l : links) {
      if (l.peer < 0 || size_t(l.peer) >= g.members.size()) continue;
      LinkStats before;
      for (const LinkStats& b : last.links)
        if (b.peer == l.peer) before = b;
      const LinkKey key{g.name, g.members[size_t(l.peer)]};
      LinkSum& sum = round_links_[key];
      const double send_s = l.send_s - before.send_s;
      const double bytes = double(l.bytes_sent - before.bytes_sent);
      sum.bytes += bytes;
      sum.send_s += send_s;
      sum.sends += int64_t(l.sends - before.sends);
      link_samples_[key].add(send_s);
      link_bytes_[key] += bytes;
    }
    last.wait_s = cs.wait_s;
    last.bytes = double(cs.bytes_sent);
    last.links = std::move(links);
  }
  ++round_steps_done_;
  if (round_steps_ <= 0 || steps_completed % round_steps_ != 0) return std::nullopt;
  std::optional<control::RoundStats> out;
  // A round that began in another epoch is cut short: it is not comparable with the others.
  if (round_steps_done_ == round_steps_) {
    control::RoundStats r = round_;
    r.set_round(steps_completed / round_steps_);
    r.set_steps(round_steps_done_);
    for (const auto& [name, wb] : round_groups_) {
      control::GroupWait* gw = r.add_groups();
      gw->set_group(name);
      gw->set_wait_s(wb.first);
      gw->set_bytes(wb.second);
    }
    for (const auto& [key, sum] : round_links_) {
      if (sum.sends == 0) continue;
      control::LinkRound* lr = r.add_links();
      lr->set_group(key.group);
      lr->set_peer(key.peer);
      lr->set_bytes(sum.bytes);
      lr->set_send_seconds(sum.send_s);
      lr->set_sends(sum.sends);
    }
    out = std::move(r);
  }
  round_.Clear();
  round_groups_.clear();
  round_links_.clear();
  round_steps_done_ = 0;
  return out;
}

report::RankPerf RoundMeter::perf(int rank) const {
  report::RankPerf p;
  p.set_rank(rank);
  const Samples& c = compute_samples_;
  p.set_steps(int(c.seen));
  *p.mutable_compute_s() = figures(c.kept, c.seen ? c.sum / double(c.seen) : 0);
  for (const auto& [key, s] : link_samples_) {
    if (s.seen == 0) continue;
    report::LinkPerf* l = p.add_links();
    l->set_group(key.group);
    l->set_peer(key.peer);
    l->set_bytes_per_step(link_bytes_.at(key) / double(s.seen));
    *l->mutable_send_s() = figures(s.kept, s.sum / double(s.seen));
  }
  return p;
}

}  // namespace keel
