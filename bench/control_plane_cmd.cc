// keel-bench control-plane's command line and table (bench/control_plane_sim.h).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/control_plane_sim.h"
#include "runtime/check.h"
#include "runtime/cli.h"

namespace keel::bench {
namespace {

// A figure's growth is flagged when it outgrows the ranks by this factor: at 256x the ranks,
// a linear figure grows 256x, one that grows 1.5x faster than that is no longer noise.
constexpr double kSuperLinear = 1.5;

struct Column {
  const char* name;
  double ControlPlaneRow::*value;
  bool per_rank;  // judged against the ranks' growth (false: expected flat)
};

const Column kColumns[] = {
    {"ctl_cpu_s/s", &ControlPlaneRow::cpu_per_s, true},
    {"msgs/s", &ControlPlaneRow::msgs_per_s, true},
    {"ctl_tx_kB/s", &ControlPlaneRow::ctl_kb_per_s, true},
    {"register_s", &ControlPlaneRow::register_s, true},
    {"detect_s", &ControlPlaneRow::detect_s, false},
    {"rebuild_s", &ControlPlaneRow::rebuild_s, true},
    {"etcd_writes", &ControlPlaneRow::etcd_writes, true},
    {"etcd_bytes", &ControlPlaneRow::etcd_bytes, true},
    {"etcd_reads", &ControlPlaneRow::etcd_reads, true},
    {"ctl_writes", &ControlPlaneRow::ctl_etcd_writes, false},
    {"failover_s", &ControlPlaneRow::failover_s, false},
};

void print_table(const std::vector<ControlPlaneRow>& rows) {
  std::printf("%7s %6s", "ranks", "slots");
  for (const Column& c : kColumns) std::printf(" %12s", c.name);
  std::printf(" %9s %s\n", "rebuild", "incidents");
  for (const ControlPlaneRow& r : rows) {
    std::printf("%7d %6d", r.ranks, r.slots);
    if (!r.error.empty()) {
      std::printf("  not measured: %s\n", r.error.c_str());
      continue;
    }
    for (const Column& c : kColumns) {
      const double v = r.*c.value;
      if (v < 0)
        std::printf(" %12s", "-");
      else
        std::printf(v >= 1000 ? " %12.0f" : " %12.4g", v);
    }
    std::printf(" %9s %d\n", r.rebuild_ok ? "ok" : "WRONG", r.incidents);
  }
  // Growth against the smallest measured size, and what outgrows the ranks.
  const ControlPlaneRow* base = nullptr;
  for (const ControlPlaneRow& r : rows)
    if (r.error.empty()) {
      base = &r;
      break;
    }
  if (!base) return;
  std::printf(
      "\ngrowth against %d ranks (x; '!' : grows faster than the ranks x %.1f; "
      "'!' on a flat figure: grows faster than the ranks' square root)\n",
      base->ranks, kSuperLinear);
  std::printf("%7s %6s", "ranks", "x");
  for (const Column& c : kColumns) std::printf(" %12s", c.name);
  std::printf("\n");
  for (const ControlPlaneRow& r : rows) {
    if (!r.error.empty()) continue;
    const double scale = double(r.ranks) / base->ranks;
    std::printf("%7d %6.0f", r.ranks, scale);
    for (const Column& c : kColumns) {
      const double v = r.*c.value, b = base->*c.value;
      if (v < 0 || b <= 0) {
        std::printf(" %12s", "-");
        continue;
      }
      const double g = v / b;
      const double bound = c.per_rank ? kSuperLinear * scale : kSuperLinear * std::sqrt(scale);
      std::printf(" %11.2f%s", g, scale > 1 && g > bound ? "!" : " ");
    }
    std::printf("\n");
  }
}

}  // namespace

Command add_control_plane_command(CLI::App& app) {
  auto o = std::make_shared<ControlPlaneOptions>();
  CLI::App* sub = app.add_subcommand(
      "control-plane",
      "the controller at scale, by simulation: a real etcd and controller (keel-launch\n"
      "--candidate), thousands of fake agents and ranks on the real protocol; per size the\n"
      "controller's CPU in steady state, a slot's loss to its Rebuild, etcd's writes per\n"
      "recovery and (--failover) a leader failover, with each figure's growth");
  sub->add_option("--ranks", o->ranks, "the sizes, in ranks (multiples of --per-slot)")
      ->delimiter(',')
      ->type_name("N,...");
  sub->add_option("--per-slot", o->per_slot, "ranks a slot (machine)")->check(CLI::Range(1, 64));
  sub->add_option("--standby", o->standby, "standby slots")->check(CLI::Range(1, 64));
  sub->add_option("--heartbeat-ms", o->heartbeat_ms, "an agent's heartbeat period")
      ->check(CLI::Range(10, 10000));
  sub->add_option("--progress-ms", o->progress_ms, "a rank's WorkerProgress period")
      ->check(CLI::Range(10, 10000));
  sub->add_option("--step-ms", o->step_ms, "a fake training step")->check(CLI::Range(10, 60000));
  sub->add_option("--steady-s", o->steady_s, "the CPU window, 0.5 to 600 seconds")
      ->transform(cli::number(0.5, 600, "seconds"));
  sub->add_option("--slot-timeout-ms", o->slot_timeout_ms,
                  "the job's detect.slot_timeout_ms (default: the config's, 2000), which also "
                  "bounds a new leader's wait for the agents to register")
      ->check(CLI::Range(100, 600000));
  sub->add_flag("--failover", o->failover,
                "also kill the leader after the recovery and time the next one's takeover");
  sub->add_option("--work-dir", o->work_dir, "where each size's etcd and run go (default /dev/shm)")
      ->type_name("DIR");
  sub->add_option("--controller", o->keel_launch,
                  "the keel-launch binary whose controller is measured (default: the one next to "
                  "keel-bench; another build's, to compare a change)")
      ->type_name("PATH")
      ->check(CLI::ExistingFile);
  return Command{sub, [o] {
                   if (o->keel_launch.empty()) o->keel_launch = exe_dir() + "/keel-launch";
                   o->config = std::string(KEEL_SOURCE_DIR) + "/examples/configs/tiny-gpt.pbtxt";
                   for (int n : o->ranks)
                     if (n <= 0 || n % o->per_slot != 0 || n / o->per_slot < 2)
                       throw InputError(detail::concat("--ranks ", n, ": a multiple of --per-slot ",
                                                       o->per_slot, " of at least 2 slots"));
                   std::vector<ControlPlaneRow> rows;
                   for (int n : o->ranks) rows.push_back(run_control_plane_size(*o, n));
                   std::printf("\n");
                   print_table(rows);
                   for (const ControlPlaneRow& r : rows)
                     if (!r.error.empty() || !r.rebuild_ok) return 1;
                   return 0;
                 }};
}

}  // namespace keel::bench
