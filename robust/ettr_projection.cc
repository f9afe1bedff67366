// The ETTR projection (robust/ettr_projection.h): the model is documented there.
#include "robust/ettr_projection.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "proto/json_gaps.h"

namespace keel {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The median of `v`; NaN when empty (the phase is then taken from the defaults).
double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Seconds to move one rank's state over the link.
double transfer_s(const ProjectionInput& in) {
  return in.state_gb * 8.0 / in.link_gbps;
}

std::string format(const char* fmt, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c, d);
  return buf;
}

}  // namespace

const char* projected_policy_name(ProjectedPolicy p) {
  switch (p) {
    case ProjectedPolicy::kHotSwap:
      return "hot_swap";
    case ProjectedPolicy::kInPlace:
      return "in_place";
    case ProjectedPolicy::kRestartAll:
      return "restart_all";
  }
  return "?";
}

std::optional<ProjectedPolicy> parse_projected_policy(std::string_view name) {
  for (auto p :
       {ProjectedPolicy::kHotSwap, ProjectedPolicy::kInPlace, ProjectedPolicy::kRestartAll})
    if (name == projected_policy_name(p)) return p;
  return std::nullopt;
}

MeasuredCosts measured_costs(const report::RunReport& r) {
  const auto policy = parse_projected_policy(r.recovery_mode());
  if (!policy)
    throw std::invalid_argument("report's recovery_mode \"" + r.recovery_mode() +
                                "\" is not hot_swap, in_place or restart_all");
  std::vector<double> detect, rebuild, restore, lost;
  for (const auto& inc : r.incidents()) {
    const double restored = inc.restored_at() > 0 ? inc.restored_at() : inc.recovered_at();
    // Only failures the job recovered from: warnings and growing back have no restore.
    if (inc.detected_at() <= 0 || restored <= 0) continue;
    if (inc.injected_at() > 0) detect.push_back(inc.detected_at() - inc.injected_at());
    if (inc.rebuilt_at() > 0) {
      rebuild.push_back(inc.rebuilt_at() - inc.detected_at());
      restore.push_back(restored - inc.rebuilt_at());
    } else {
      // No rebuild mark (a recovery without an epoch rebuild): all of it counts as rebuild,
      // none as restore, so none of it is scaled with the state.
      rebuild.push_back(restored - inc.detected_at());
      restore.push_back(0);
    }
    lost.push_back(inc.steps_lost());
  }
  if (lost.empty())
    throw std::invalid_argument("report has no incident that was both detected and restored");
  MeasuredCosts m;
  m.policy = *policy;
  m.incidents = int(lost.size());
  m.detect_s = median(detect);
  m.rebuild_s = median(rebuild);
  m.restore_s = median(restore);
  m.steps_lost = median(lost);
  m.state_bytes = r.snapshot_bytes();
  return m;
}

MeasuredCosts measured_costs_from_json(const std::string& json) {
  report::RunReport r;
  const std::string why = message_from_json(json, &r);
  if (!why.empty()) throw std::invalid_argument("not a RunReport JSON: " + why);
  return measured_costs(r);
}

double failure_rate_per_s(const ProjectionInput& in) {
  return double(in.machines) / (in.mtbf_hours * 3600.0);
}

double ettr_from(double failures_per_s, double cost_per_incident_s) {
  return 1.0 / (1.0 + failures_per_s * cost_per_incident_s);
}

double poisson_at_least(double mean, int k) {
  if (k <= 0) return 1.0;
  // 1 − P[X < k], summing the terms upward from P[X = 0] = e^-mean.
  double term = std::exp(-mean), below = 0;
  for (int i = 0; i < k; ++i) {
    below += term;
    term *= mean / double(i + 1);
  }
  return std::max(0.0, 1.0 - below);
}

int checkpoint_interval_steps(const ProjectionInput& in) {
  if (in.checkpoint_every_steps > 0) return in.checkpoint_every_steps;
  return std::max(1, int(std::lround(1800.0 / in.step_s)));
}

IncidentCost incident_cost(const ProjectionInput& in, ProjectedPolicy p) {
  IncidentCost c;
  double rebuild_default = kDefaultHotSwapRebuildS;
  if (p == ProjectedPolicy::kInPlace) rebuild_default = kDefaultInPlaceRebuildS;
  if (p == ProjectedPolicy::kRestartAll) rebuild_default = kDefaultRestartAllRebuildS;
  c.detect_s = kDefaultDetectS;
  c.rebuild_s = rebuild_default;
  c.restore_s = transfer_s(in);
  double steps_lost = 0;
  c.source = "defaults";

  const auto it = in.measured.find(p);
  if (it != in.measured.end()) {
    const MeasuredCosts& m = it->second;
    c.source = "measured (" + std::to_string(m.incidents) + " incidents)";
    if (!std::isnan(m.detect_s)) c.detect_s = m.detect_s;
    if (!std::isnan(m.rebuild_s)) c.rebuild_s = m.rebuild_s;
    if (!std::isnan(m.restore_s)) {
      const double extra_bytes = std::max(0.0, in.state_gb * 1e9 - m.state_bytes);
      c.restore_s = m.restore_s + extra_bytes * 8.0 / (in.link_gbps * 1e9);
    }
    if (!std::isnan(m.steps_lost)) steps_lost = m.steps_lost;
  }
  // restart_all goes back to the newest persistent checkpoint: half an interval on average,
  // whatever interval the measured job had.
  if (p == ProjectedPolicy::kRestartAll) steps_lost = 0.5 * checkpoint_interval_steps(in);
  c.lost_s = (steps_lost + 0.5) * in.step_s;

  if (p != ProjectedPolicy::kInPlace && in.standbys >= 0) {
    const double in_repair = failure_rate_per_s(in) * in.repair_hours * 3600.0;
    const double p_none = poisson_at_least(in_repair, in.standbys);
    c.wait_s = p_none * in.repair_hours * 3600.0 / double(in.standbys + 1);
  }
  return c;
}

PolicyProjection project(const ProjectionInput& in, ProjectedPolicy p) {
  PolicyProjection out;
  out.policy = p;
  const double rate = failure_rate_per_s(in);
  out.failures_per_day = rate * 86400.0;
  if (p != ProjectedPolicy::kInPlace && in.standbys >= 0)
    out.p_no_standby = poisson_at_least(rate * in.repair_hours * 3600.0, in.standbys);
  out.cost = incident_cost(in, p);
  out.ettr = ettr_from(rate, out.cost.total());
  return out;
}

std::vector<std::string> projection_assumptions(const ProjectionInput& in) {
  std::vector<std::string> a;
  a.push_back(format("failures: Poisson, rate = machines / MTBF = %.0f / %g h = %.3f per hour",
                     in.machines, in.mtbf_hours, failure_rate_per_s(in) * 3600.0));
  a.push_back(
      "every failure is one incident; GPU, process and link failures are folded into "
      "the machine MTBF");
  a.push_back(format(
      "restore: %.2f GB per rank over its own %.0f Gbit/s link = %.1f s (every "
      "rank in parallel); a measured restore adds the bytes beyond the measured ones at that rate",
      in.state_gb, in.link_gbps, transfer_s(in)));
  a.push_back(
      "hot_swap: a standby takes the failed machine's ranks and fetches their state "
      "from the backup holders");
  a.push_back(
      "in_place: the failed ranks restart on the same machine (the failure is one a "
      "restart cures) and fetch their state as hot_swap does; no standby needed");
  a.push_back(
      format("restart_all: every rank restarts and reads a persistent checkpoint; "
             "checkpoint every %.0f steps, half of it lost on average",
             checkpoint_interval_steps(in)));
  a.push_back(
      format("lost work: (steps thrown away + 0.5 for the step in flight) x %.3f s", in.step_s));
  a.push_back(
      format("defaults where nothing was measured: detect %.0f s; rebuild hot_swap "
             "%.0f s, in_place %.0f s, restart_all (a full restart) %.0f s",
             kDefaultDetectS, kDefaultHotSwapRebuildS, kDefaultInPlaceRebuildS,
             kDefaultRestartAllRebuildS));
  a.push_back("measured detection, rebuild and restart times are taken as they are at scale");
  if (in.standbys < 0) {
    a.push_back("standbys: one is ready for every failure (give --standbys K to model a pool)");
  } else {
    a.push_back(
        format("standbys: K = %.0f, repair %g h (exponential); machines in repair "
               "~ Poisson(rate x repair); with none ready a failure waits repair/(K+1)",
               in.standbys, in.repair_hours));
  }
  a.push_back(
      "ETTR = 1 / (1 + rate x cost per incident): failures arrive while training; one "
      "during a recovery is absorbed by it");
  return a;
}

}  // namespace keel
