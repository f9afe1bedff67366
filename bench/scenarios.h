// keel-bench's subcommands: the developer benchmarks that each measure one mechanism (bench/
// RESULTS.md records their output), and the projection to scale. Each adds itself to keel-bench's
// CLI::App with its own flags; keel-bench's main parses once and runs the one chosen:
//
//   CLI::App app(...);
//   std::vector<Command> commands = {add_cpu_command(app), ...};
//   if (auto rc = cli::parse(app, argc, argv)) return *rc;
//   for (const Command& c : commands) if (c.app->parsed()) return c.run();
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

#include "runtime/cli.h"

namespace keel::bench {

// The bounds of the subcommands' counts, which cli::whole_number says in words: the steps of a
// run, and the repeats, pairs, rounds or injections of one measurement (hours of runs each).
constexpr int kMaxSteps = 1'000'000;
constexpr int kMaxRepeats = 1000;

// A subcommand: its CLI11 app (parsed() once chosen on the command line) and what runs it with
// the flags parsed, returning the process's exit status.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// keel-bench cpu (bench_cpu.cc): throughput and MFU of three model sizes on this CPU next to
// its SGEMM peak, the parallel layouts (--layouts), or the CPU-speed report (--speed).
Command add_cpu_command(CLI::App& app);
// keel-bench recovery (bench_recovery.cc): what every-step snapshots cost, and the time from a
// crash to the next step under in_place and restart_all.
Command add_recovery_command(CLI::App& app);
// keel-bench detect (bench_detect.cc): keel-launch's control-plane overhead and its detection
// latency per fault kind, and the fail-slow rows.
Command add_detect_command(CLI::App& app);
// keel-bench sdc (bench_sdc.cc): what the in-flight silent-data-corruption checks cost.
Command add_sdc_command(CLI::App& app);
// keel-bench restore (bench_restore.cc): restoring one rank from its backup holder, and the
// host memory of its snapshot and backup segments.
Command add_restore_command(CLI::App& app);
// keel-bench reshard (bench_reshard.cc): loading a persistent checkpoint into another layout,
// against the same layout.
Command add_reshard_command(CLI::App& app);
// keel-bench project (projection.cc): the expected ETTR of each policy at scale.
Command add_project_command(CLI::App& app);

}  // namespace keel::bench
