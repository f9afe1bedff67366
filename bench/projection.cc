// keel-bench project (bench/projection.h): flags in, the model's assumptions and a table out.
#include "bench/projection.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "robust/ettr_projection.h"
#include "runtime/text.h"

namespace keel::bench {
namespace {

// The reference point the issue names: 97% ETTR on 9,600 GPUs (1,200 machines × 8).
constexpr double kReferenceEttr = 0.97;
constexpr int kReferenceMachines = 1200;
constexpr int kReferenceGpusPerMachine = 8;

struct Flag {
  const char* name;
  const char* value;  // what the help calls its value
  const char* help;
  std::function<void(const std::string&)> set;
};

double to_double(const std::string& flag, const std::string& v) {
  size_t end = 0;
  double d = 0;
  try {
    d = std::stod(v, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  if (end == 0 || end != v.size()) throw std::invalid_argument(flag + ": not a number: " + v);
  return d;
}

int to_int(const std::string& flag, const std::string& v) {
  const double d = to_double(flag, v);
  if (d != double(int(d))) throw std::invalid_argument(flag + ": not an integer: " + v);
  return int(d);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("--from: cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void print_help(const std::vector<Flag>& flags) {
  std::printf(
      "usage: keel-bench project --mtbf-hours H --step-s S --state-gb G [flags]\n\n"
      "The expected ETTR of each recovery policy at scale (model: "
      "robust/ettr_projection.h).\n\n");
  for (const auto& f : flags)
    std::printf("  --%-24s %s\n", (std::string(f.name) + " " + f.value).c_str(), f.help);
}

void print_table(const ProjectionInput& in, const std::vector<ProjectedPolicy>& policies) {
  std::printf(
      "\n%d machines x %d GPUs = %d GPUs, machine MTBF %.0f h, step %.3f s, state %.2f "
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

}  // namespace

int project_main(int argc, char** argv) {
  ProjectionInput in;
  bool have_mtbf = false, have_step = false, have_state = false, help = false;
  std::vector<ProjectedPolicy> policies = {ProjectedPolicy::kHotSwap, ProjectedPolicy::kInPlace,
                                           ProjectedPolicy::kRestartAll};
  std::vector<std::string> from;
  const std::vector<Flag> flags = {
      {"machines", "N", "machines in the job (1250)",
       [&](const std::string& v) { in.machines = to_int("--machines", v); }},
      {"gpus-per-machine", "N", "GPUs (ranks) per machine (8)",
       [&](const std::string& v) { in.gpus_per_machine = to_int("--gpus-per-machine", v); }},
      {"mtbf-hours", "H", "one machine's mean time between failures, hours (required)",
       [&](const std::string& v) {
         in.mtbf_hours = to_double("--mtbf-hours", v), have_mtbf = true;
       }},
      {"step-s", "S", "seconds per training step at scale (required)",
       [&](const std::string& v) { in.step_s = to_double("--step-s", v), have_step = true; }},
      {"state-gb", "G", "training state per rank, GB (required)",
       [&](const std::string& v) { in.state_gb = to_double("--state-gb", v), have_state = true; }},
      {"from", "FILE",
       "a keel-launch --report JSON; per-incident costs for its recovery_mode "
       "(repeat for more policies)",
       [&](const std::string& v) { from.push_back(v); }},
      {"link-gbps", "B", "link per rank for a restore or checkpoint read, Gbit/s (100)",
       [&](const std::string& v) { in.link_gbps = to_double("--link-gbps", v); }},
      {"standbys", "K", "ready standby machines (default: one always ready)",
       [&](const std::string& v) { in.standbys = to_int("--standbys", v); }},
      {"repair-hours", "R", "a failed machine back in the standby pool, hours (24)",
       [&](const std::string& v) { in.repair_hours = to_double("--repair-hours", v); }},
      {"policies", "LIST", "hot_swap,in_place,restart_all (all)",
       [&](const std::string& v) {
         policies.clear();
         for (const auto& name : split(v, ',', /*skip_empty=*/true)) {
           const auto p = parse_projected_policy(name);
           if (!p) throw std::invalid_argument("--policies: unknown policy " + name);
           policies.push_back(*p);
         }
       }},
      {"checkpoint-every-steps", "N", "restart_all's checkpoint interval (30 minutes of steps)",
       [&](const std::string& v) {
         in.checkpoint_every_steps = to_int("--checkpoint-every-steps", v);
       }},
  };

  try {
    int i = 1;
    if (i < argc && std::string(argv[i]) == "project") ++i;
    for (; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        help = true;
        continue;
      }
      if (arg.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument " + arg);
      std::string value;
      bool inline_value = false;
      if (const auto eq = arg.find('='); eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        inline_value = true;
      }
      const Flag* flag = nullptr;
      for (const auto& f : flags)
        if (arg == std::string("--") + f.name) flag = &f;
      if (!flag) throw std::invalid_argument("unknown flag " + arg);
      if (!inline_value) {
        if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
        value = argv[++i];
      }
      flag->set(value);
    }
    if (help) {
      print_help(flags);
      return 0;
    }
    if (!have_mtbf || !have_step || !have_state)
      throw std::invalid_argument("--mtbf-hours, --step-s and --state-gb are required");
    if (in.machines < 1 || in.gpus_per_machine < 1 || in.mtbf_hours <= 0 || in.step_s <= 0 ||
        in.state_gb < 0 || in.link_gbps <= 0 || in.repair_hours <= 0 || policies.empty())
      throw std::invalid_argument(
          "machines, GPUs, MTBF, step, link and repair time must be "
          "positive, the state not negative, and a policy named");
    for (const auto& path : from) {
      const MeasuredCosts m = measured_costs_from_json(read_file(path));
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
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "keel-bench project: %s (--help lists the flags)\n", e.what());
    return 2;
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

}  // namespace keel::bench
