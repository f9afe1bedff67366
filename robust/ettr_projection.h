// ETTR at scale from per-incident costs (keel-bench project): what the recovery times measured
// on a few ranks mean for a job of thousands of GPUs.
//
// Pure code: no processes, no clock. The model, stated once here and printed by
// projection_assumptions():
//
//   Failures. Machines fail independently, each with mean time between failures MTBF hours, so
//   the job sees a Poisson process of rate  lambda = machines / MTBF.  Every failure is one
//   incident; failures of GPUs, processes and links are folded into the machine's MTBF.
//
//   Cost of one incident (seconds of wall time in which no kept step runs), by phase:
//     detect    the fault happened → the controller knew;
//     rebuild   hot_swap: evict the slot, promote a standby, rebuild the communicators;
//               in_place: start the rank again where it was, rebuild the communicators;
//               restart_all: stop every rank and start the whole job again;
//     restore   hot_swap and in_place: the rank's state (state_gb per rank) fetched from its
//               backup holder over one link of link_gbps (every rank in parallel, so the time
//               of one); restart_all: every rank reads its shard of a persistent checkpoint at
//               link_gbps;
//     lost      (steps thrown away + 1/2 for the step in flight) × step_s; restart_all
//               throws away on average half a checkpoint interval instead;
//     wait      hot_swap and restart_all need a ready standby for the failed machine (below);
//               in_place restarts on the same machine and waits for none.
//
//   Measured costs. From a keel-launch report (--from): the median over its incidents of
//   detected_at − injected_at, rebuilt_at − detected_at, restored_at − rebuilt_at and
//   steps_lost, for the report's recovery_mode. These times are taken as they are at scale,
//   except restore, which grows with the state: the measured restore plus the bytes beyond the
//   measured snapshot_bytes moved over the link, (state_gb·1e9 − snapshot_bytes)·8 / link_gbps
//   (never less than measured). Not measured × state / snapshot_bytes: a restore measured on a
//   small state is mostly fixed cost (a 0.5 s restore of 1 MB would claim 2 MB/s), and scaling
//   it linearly would project hours. restart_all's measured steps_lost reflects the
//   measured job's checkpoint interval, so it is replaced by half the given one. A policy
//   without a report uses documented defaults (kDefault* below).
//
//   Standbys. With K standbys and a failed machine repaired in repair_hours (exponential), the
//   machines in repair are Poisson with mean lambda × repair (an M/M/inf queue), so a failure
//   finds no standby ready with probability P[Poisson(lambda·repair) >= K]. It then waits for
//   the first of the K+1 machines in repair to come back, on average repair / (K+1). The
//   expected wait per incident is that probability times that wait. Without --standbys
//   (K < 0) a standby is assumed ready for every failure.
//
//   ETTR. Between incidents the job trains for 1/lambda on average, then spends the incident's
//   cost C: a renewal process whose productive share is
//       ETTR = 1 / (1 + lambda × C).
//   This counts failures while the job trains; a failure during a recovery is taken to be
//   absorbed by it (exact when lambda × C << 1; the error is of order (lambda × C)^2).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/report.pb.h"

namespace keel {

enum class ProjectedPolicy { kHotSwap, kInPlace, kRestartAll };

// "hot_swap", "in_place", "restart_all" (recovery.mode's names).
const char* projected_policy_name(ProjectedPolicy p);
std::optional<ProjectedPolicy> parse_projected_policy(std::string_view name);

// Defaults for a policy without a measured report (seconds): detection by heartbeat and
// collective timeouts at scale, a standby swap, a process restart in place, and a restart of
// thousands of processes with their rendezvous.
inline constexpr double kDefaultDetectS = 10.0;
inline constexpr double kDefaultHotSwapRebuildS = 15.0;
inline constexpr double kDefaultInPlaceRebuildS = 30.0;
inline constexpr double kDefaultRestartAllRebuildS = 300.0;

// Per-incident costs measured in one run: medians over its incidents (NaN: no incident had the
// timestamps for that phase, and the default is used).
struct MeasuredCosts {
  ProjectedPolicy policy = ProjectedPolicy::kHotSwap;
  int incidents = 0;  // incidents that went into the medians
  double detect_s = 0;
  double rebuild_s = 0;
  double restore_s = 0;
  double steps_lost = 0;
  double state_bytes = 0;  // RunReport.snapshot_bytes (0: unknown; the whole state is added)
};

// The medians of a report's incidents, for its recovery_mode. Throws std::invalid_argument when
// the mode is not one of the three policies or no incident was both detected and restored.
MeasuredCosts measured_costs(const report::RunReport& r);
// The same from a keel-launch --report JSON (unknown fields ignored); throws
// std::invalid_argument when it does not parse.
MeasuredCosts measured_costs_from_json(const std::string& json);

struct ProjectionInput {
  int machines = 1250;
  int gpus_per_machine = 8;
  double mtbf_hours = 0;           // one machine's mean time between failures
  double step_s = 0;               // one training step at scale
  double state_gb = 0;             // state per rank (GB, 1e9 bytes)
  double link_gbps = 100;          // the link a restore or checkpoint read runs over (1e9 bit/s)
  int standbys = -1;               // K ready standby machines; < 0: one is always ready
  double repair_hours = 24;        // a failed machine back in the standby pool
  int checkpoint_every_steps = 0;  // restart_all's interval; 0: every 30 minutes of steps
  std::map<ProjectedPolicy, MeasuredCosts> measured;
};

// One incident's expected cost by phase (seconds).
struct IncidentCost {
  double detect_s = 0;
  double rebuild_s = 0;
  double restore_s = 0;
  double lost_s = 0;
  double wait_s = 0;   // expected standby wait (probability × mean wait)
  std::string source;  // "measured (N incidents)" or "defaults"
  double total() const { return detect_s + rebuild_s + restore_s + lost_s + wait_s; }
};

struct PolicyProjection {
  ProjectedPolicy policy = ProjectedPolicy::kHotSwap;
  double failures_per_day = 0;
  double p_no_standby = 0;  // probability a failure finds no standby ready
  IncidentCost cost;
  double ettr = 0;
};

// lambda = machines / MTBF, per second.
double failure_rate_per_s(const ProjectionInput& in);
// 1 / (1 + rate × cost): the renewal model above.
double ettr_from(double failures_per_s, double cost_per_incident_s);
// P[Poisson(mean) >= k]; 1 for k <= 0.
double poisson_at_least(double mean, int k);
// restart_all's interval in steps (checkpoint_every_steps, or 30 minutes of steps).
int checkpoint_interval_steps(const ProjectionInput& in);

IncidentCost incident_cost(const ProjectionInput& in, ProjectedPolicy p);
PolicyProjection project(const ProjectionInput& in, ProjectedPolicy p);

// The model's assumptions and the inputs that fill them, one line each, for printing.
std::vector<std::string> projection_assumptions(const ProjectionInput& in);

}  // namespace keel
