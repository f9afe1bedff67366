#include "launcher/worker_options.h"

#include "launcher/job_env.h"

#include <cstdlib>
#include <string>

#include "runtime/check.h"
#include "runtime/cli.h"

namespace keel {
namespace {

// A world bigger than any job keel runs, small enough that rank arithmetic cannot overflow.
constexpr int kMaxWorld = 1 << 20;

struct WorkerCli {
  CLI::App app{
      "keel-worker: trains one rank of a job, or with --nproc starts N local ranks and "
      "supervises them through their failures.",
      "keel-worker"};
  cli::JobFlags job;
  cli::FaultFlags faults;
};

void add_worker_flags(WorkerCli* c, WorkerOptions* o) {
  CLI::App& app = c->app;
  cli::add_job_flags(app, &c->job, /*config_required=*/true);
  app.add_option("--report", o->report_path, "write a JSON report (rank 0)")->type_name("FILE");
  app.add_option("--export-llmc", o->export_llmc_path,
                 "write the trained weights as an llm.c checkpoint (rank 0)")
      ->type_name("FILE");
  app.add_option("--loss-svg", o->loss_svg_path, "draw the loss curve as an SVG (rank 0)")
      ->type_name("FILE");
  // Only >= 1 here: check_launch (launcher/worker/input_checks.h) says what bounds N, and how the
  // config's tp·pp·dp disagrees.
  app.add_option("--nproc", o->nproc,
                 "start N local ranks (N = tp·pp·dp) with a store, and supervise them")
      ->type_name("N")
      ->check(cli::range(1, kMaxWorld));
  // keel-launch and --nproc start ranks with these in the environment; a flag given wins.
  app.add_option("--rank", o->rank, "this process's rank, below --world (or KEEL_RANK)")
      ->type_name("R")
      ->envname("KEEL_RANK")
      ->check(cli::range(0, kMaxWorld));
  app.add_option("--world", o->world_size,
                 "the number of ranks that meet through --store (or KEEL_WORLD_SIZE)")
      ->type_name("N")
      ->envname("KEEL_WORLD_SIZE")
      ->check(cli::range(1, kMaxWorld));
  app.add_option("--store", o->store_addr,
                 "the TCP store the ranks meet through (or KEEL_STORE_ADDR)")
      ->type_name("HOST:PORT")
      ->envname(env::kStoreAddr);
  cli::add_fault_flags(app, &c->faults);
  app.add_option("--resume", o->resume_dir,
                 "continue from the newest complete persistent checkpoint in DIR")
      ->type_name("DIR");
  app.add_flag("--quiet", o->quiet, "no per-step progress lines");
}

}  // namespace

std::string worker_usage() {
  WorkerCli c;
  WorkerOptions o;
  add_worker_flags(&c, &o);
  return cli::help(c.app);
}

std::optional<int> parse_worker_options(int argc, char** argv, WorkerOptions* o) {
  WorkerCli c;
  add_worker_flags(&c, o);
  if (auto rc = cli::parse(c.app, argc, argv)) return rc;
  o->config_path = c.job.config;
  o->overrides = c.job.set;
  o->faults = c.faults.fault;
  o->inject_path = c.faults.inject;
  // Set by keel-launch only, so no flag (launcher/job_env.h checks it is a number).
  try {
    const int local = JobEnv::get().local_world_size;
    if (local > kMaxWorld)
      return cli::usage_error(c.app, detail::concat(env::kLocalWorldSize, " = ", local,
                                                    ": expected at most ", kMaxWorld));
    if (local > 0) o->local_world_size = local;
  } catch (const InputError& e) {
    return cli::usage_error(c.app, e.what());
  }
  if (o->rank >= o->world_size)
    return cli::usage_error(
        c.app, detail::concat("--rank ", o->rank, " is not below --world ", o->world_size,
                              " (or KEEL_RANK, KEEL_WORLD_SIZE)"));
  if (o->world_size > 1 && o->store_addr.empty() && o->nproc == 0)
    return cli::usage_error(c.app, "--world > 1 needs --store HOST:PORT (or KEEL_STORE_ADDR)");
  return std::nullopt;
}

}  // namespace keel
