// keel-bench project: the expected ETTR of each recovery policy at a given scale, from
// per-incident costs measured in keel-launch reports or documented defaults (the model:
// robust/ettr_projection.h). Flags in; the model's assumptions, a table per policy (failures
// per day, cost per incident by phase, ETTR) and the comparison with 97% ETTR on 9,600 GPUs
// out.
//
//   keel-bench project --mtbf-hours H --step-s S --state-gb G [--machines 1250]
//       [--gpus-per-machine 8] [--from report.json]... [--link-gbps 100] [--standbys K]
//       [--repair-hours 24] [--policies hot_swap,in_place,restart_all]
//       [--checkpoint-every-steps N]
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/scenarios.h"
#include "robust/ettr_projection.h"
#include "runtime/check.h"
#include "runtime/cli.h"

namespace keel::bench {
namespace {

// The reference point the issue names: 97% ETTR on 9,600 GPUs (1,200 machines × 8).
constexpr double kReferenceEttr = 0.97;
constexpr int kReferenceMachines = 1200;
constexpr int kReferenceGpusPerMachine = 8;

// The bounds of the flags: wide enough for any real job, narrow enough that the model's
// arithmetic stays finite (machines x GPUs an int, 1800 / step_s steps an int, no 0 x inf).
constexpr int kMaxMachines = 1'000'000;
constexpr int kMaxGpusPerMachine = 1024;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError("--from " + path + ": cannot read it");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void print_table(const ProjectionInput& in, const std::vector<ProjectedPolicy>& policies) {
  std::printf(
      "\n%d machines x %d GPUs = %d GPUs, machine MTBF %g h, step %.3f s, state %.2f "
      "GB per rank\n",
      in.machines, in.gpus_per_machine, in.machines * in.gpus_per_machine, in.mtbf_hours, in.step_s,
      in.state_gb);
  std::printf("%-12s %9s %8s %8s %8s %8s %8s %9s %8s  %s\n", "policy", "fail/day", "detect",
              "rebuild", "restore", "lost", "wait", "incident", "ETTR", "costs from");
  for (const auto p : policies) {
    const PolicyProjection r = project(in, p);
    std::printf("%-12s %9.2f %7.1fs %7.1fs %7.1fs %7.1fs %7.1fs %8.1fs %7.2f%%  %s\n",
                projected_policy_name(p), r.failures_per_day, r.cost.detect_s, r.cost.rebuild_s,
                r.cost.restore_s, r.cost.lost_s, r.cost.wait_s, r.cost.total(), 100.0 * r.ettr,
                r.cost.source.c_str());
    if (in.standbys >= 0 && p != ProjectedPolicy::kInPlace)
      std::printf("%-12s %9s no standby ready at %.2f%% of failures\n", "", "",
                  100.0 * r.p_no_standby);
  }
}

struct ProjectOptions {
  ProjectionInput in;
  std::vector<std::string> policies = {"hot_swap", "in_place", "restart_all"};
  std::vector<std::string> from;
};

int project_main(const ProjectOptions& o) {
  ProjectionInput in = o.in;
  std::vector<ProjectedPolicy> policies;
  for (const std::string& name : o.policies) policies.push_back(*parse_projected_policy(name));
  for (const auto& path : o.from) {
    MeasuredCosts m;
    try {
      m = measured_costs_from_json(read_file(path));
    } catch (const std::invalid_argument& e) {
      // protobuf's parse error quotes the text on lines of its own: the first says what.
      const std::string what = e.what();
      throw InputError("--from " + path + ": " + what.substr(0, what.find('\n')));
    }
    // A phase no incident had timestamps for is NaN and comes from the defaults.
    const auto secs = [](double v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3f s", v);
      return std::isnan(v) ? std::string("default") : std::string(buf);
    };
    std::printf(
        "measured %s in %s: %d incidents, medians detect %s, rebuild %s, restore %s "
        "of %.0f bytes, %.1f steps lost\n",
        projected_policy_name(m.policy), path.c_str(), m.incidents, secs(m.detect_s).c_str(),
        secs(m.rebuild_s).c_str(), secs(m.restore_s).c_str(), m.state_bytes, m.steps_lost);
    in.measured[m.policy] = m;
  }

  std::printf("model (robust/ettr_projection.h):\n");
  for (const auto& line : projection_assumptions(in)) std::printf("  - %s\n", line.c_str());
  print_table(in, policies);

  ProjectionInput ref = in;
  ref.machines = kReferenceMachines;
  ref.gpus_per_machine = kReferenceGpusPerMachine;
  std::printf("\nreference: %.0f%% ETTR on 9,600 GPUs. The same model at %d machines x %d:",
              100.0 * kReferenceEttr, kReferenceMachines, kReferenceGpusPerMachine);
  for (const auto p : policies) {
    const double e = project(ref, p).ettr;
    std::printf(" %s %.2f%% (%+.2f points)", projected_policy_name(p), 100.0 * e,
                100.0 * (e - kReferenceEttr));
  }
  std::printf("\nat %d GPUs against the reference's 97%%:", in.machines * in.gpus_per_machine);
  for (const auto p : policies) {
    const double e = project(in, p).ettr;
    std::printf(" %s %+.2f points", projected_policy_name(p), 100.0 * (e - kReferenceEttr));
  }
  std::printf("\n");
  return 0;
}

}  // namespace

Command add_project_command(CLI::App& app) {
  auto o = std::make_shared<ProjectOptions>();
  CLI::App* sub = app.add_subcommand(
      "project", "the expected ETTR of each recovery policy at scale (10,000 GPUs and more)");
  ProjectionInput& in = o->in;
  sub->add_option("--machines", in.machines, "machines in the job, 1 to 1000000 (default 1250)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxMachines));
  sub->add_option("--gpus-per-machine", in.gpus_per_machine,
                  "GPUs (ranks) per machine, 1 to 1024 (default 8)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxGpusPerMachine));
  sub->add_option("--mtbf-hours", in.mtbf_hours,
                  "one machine's mean time between failures, hours, 0.001 to 10000000 (required)")
      ->option_text("H")
      ->transform(cli::number(0.001, 1e7, "hours"))
      ->required();
  sub->add_option("--step-s", in.step_s,
                  "seconds per training step at scale, 0.001 to 86400 (required)")
      ->option_text("S")
      ->transform(cli::number(0.001, 86400, "seconds"))
      ->required();
  sub->add_option("--state-gb", in.state_gb, "training state per rank, GB, 0 to 100000 (required)")
      ->option_text("G")
      ->transform(cli::number(0, 1e5, "GB"))
      ->required();
  sub->add_option("--from", o->from,
                  "a keel-launch --report JSON: per-incident costs for its recovery_mode, in "
                  "place of the defaults (repeatable, one per policy)")
      ->option_text("FILE")
      ->check(CLI::ExistingFile);
  sub->add_option("--link-gbps", in.link_gbps,
                  "link per rank for a restore or checkpoint read, Gbit/s, 0.001 to 100000 "
                  "(default 100)")
      ->option_text("B")
      ->transform(cli::number(0.001, 1e5, "Gbit/s"));
  sub->add_option("--standbys", in.standbys,
                  "ready standby machines, 0 to 1000000 (default: one always ready)")
      ->option_text("K")
      ->transform(cli::whole_number(0, kMaxMachines));
  sub->add_option("--repair-hours", in.repair_hours,
                  "a failed machine back in the standby pool, hours, 0.001 to 100000 (default 24)")
      ->option_text("R")
      ->transform(cli::number(0.001, 1e5, "hours"));
  sub->add_option("--policies", o->policies,
                  "hot_swap, in_place, restart_all, comma-separated (default all three)")
      ->option_text("LIST")
      ->delimiter(',')
      ->check(CLI::IsMember({"hot_swap", "in_place", "restart_all"}));
  sub->add_option("--checkpoint-every-steps", in.checkpoint_every_steps,
                  "restart_all's checkpoint interval, 1 to 1000000000 (default: 30 minutes of "
                  "steps)")
      ->option_text("N")
      ->transform(cli::whole_number(1, 1'000'000'000));
  return {sub, [o] { return project_main(*o); }};
}

}  // namespace keel::bench
