// keel-bench: MFU and ETTR of a job under a fault schedule, per recovery policy, in one
// command. It runs the job fault-free once, then under the schedule once per policy (the same
// seed and schedule each time), each with keel-launch, and writes DIR/report.json,
// DIR/report.html and TensorBoard event files DIR/tb/<run>/ (see README, "Benchmark MFU under
// faults").
//
//   keel-bench --config C [--inject SCHEDULE | --fault KIND@step=S,rank=R ... |
//              --mtbf-s T --kinds crash,hang,... --seed N]
//              [--policies hot_swap,in_place,restart_all] [--local N --standby K
//              --workers-per-slot W] [--persistent-every N] [--set key=value ...] --out DIR
//   keel-bench --soak N --config C --out DIR ...   (bench/soak.h)
//   keel-bench cpu|recovery|detect|sdc|restore|reshard|project ...   (bench/scenarios.h)
//   keel-bench control-plane ...   (bench/control_plane_sim.h)
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_report.h"
#include "bench/bench_util.h"
#include "bench/control_plane_sim.h"
#include "bench/fault_draw.h"
#include "bench/report_html.h"
#include "bench/scenarios.h"
#include "bench/soak.h"
#include "proto/bench.pb.h"
#include "proto/config_loader.h"
#include "proto/faults.pb.h"
#include "robust/fault_spec.h"
#include "runtime/check.h"
#include "runtime/cli.h"
#include "runtime/logging.h"

namespace keel::bench {
namespace {

struct Options {
  cli::JobFlags job;                                                      // --config, --set
  cli::FaultFlags fault;                                                  // --fault, --inject
  cli::SlotFlags slots{.local = 0, .standby = 2, .workers_per_slot = 2};  // see add_flags
  std::string out;
  double mtbf_s = 0;
  std::vector<std::string> kinds = {"crash"};
  uint64_t seed = 1;
  std::vector<std::string> policies = {"hot_swap", "in_place", "restart_all"};
  int persistent_every = 50;
  bool persistent_restart_all_only = false;
  int soak = 0;  // faults of a soak (bench/soak.h); 0: the policy comparison
  std::string soak_machines = "auto";
  double soak_kill_controller_every_s = 30;
  std::string soak_etcd = "job";
};

// The longest checkpoint interval (the config's int32 field, with room to spare).
constexpr int kMaxCheckpointEvery = 1'000'000'000;
// The most faults of a soak: one every few steps, its job's steps still an int32.
constexpr int kMaxSoakFaults = 100'000;

// The names of faults::Fault::Kind, which --kinds takes.
std::vector<std::string> fault_kind_names() {
  std::vector<std::string> names;
  const google::protobuf::EnumDescriptor* d = faults::Fault::Kind_descriptor();
  for (int i = 0; i < d->value_count(); ++i) names.push_back(d->value(i)->name());
  return names;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string quote(const std::string& s) {
  return "'" + s + "'";
}

// The keel-launch flags of a run. Every run writes persistent checkpoints (their cost then
// in every run alike, as a real job pays it); restart_all restores from them. With
// --persistent-restart-all-only the others rely on the in-memory snapshots alone.
std::string common_args(const Options& o, const std::string& ckpt_dir, const std::string& policy) {
  std::string a = "--config " + quote(o.job.config) + " --local " + std::to_string(o.slots.local) +
                  " --standby " + std::to_string(o.slots.standby) + " --workers-per-slot " +
                  std::to_string(o.slots.workers_per_slot);
  for (const std::string& s : o.job.set) a += " --set " + quote(s);
  const bool persistent = policy == "restart_all" || !o.persistent_restart_all_only;
  a += " --set checkpoint.persistent_every_steps=" +
       std::to_string(persistent ? o.persistent_every : 0);
  a += " --set " + quote("checkpoint.dir=" + ckpt_dir);
  return a;
}

// One keel-launch run named `name` under DIR/runs/<name>, its checkpoints fresh.
BenchRun launch(const Options& o, const std::string& name, const std::string& policy,
                const std::string& extra, double step_s, double tokens_per_step,
                const std::string& reference) {
  const std::string dir = o.out + "/runs/" + name;
  const std::string ckpt = dir + "/checkpoints";
  std::filesystem::remove_all(ckpt);
  std::filesystem::create_directories(dir);
  std::printf("keel-bench: %s ...\n", name.c_str());
  std::fflush(stdout);
  const double started = unix_now();
  const int rc = run(dir, "keel-launch",
                     common_args(o, ckpt, policy) + " --set recovery.mode=" + policy + " " + extra);
  report::RunReport r;
  if (!read_report(dir + "/report.json", &r)) r.Clear();
  BenchRun b = make_run(name, policy, rc, r, step_s, tokens_per_step, reference);
  // The job's clock, not keel-bench's: step times count from the job's start, which comes
  // after keel-launch's own start-up.
  b.set_started_at(r.job_start_at() > 0 ? r.job_start_at() : started);
  b.set_run_dir(dir);
  if (!b.ok()) LOG(ERROR) << name << " failed (exit " << rc << "; see " << dir << "/run.log)";
  return b;
}

// The faults of --fault and --inject, read and checked against the job's world before any run
// starts, so that a mistake in them is told at once, not after the fault-free run. Their steps
// are not checked: a fault past the job's end is left out, and said so, once the runs begin.
faults::FaultSchedule given_faults(const Options& o, int world) {
  FaultPlan plan;
  for (const std::string& f : o.fault.fault) add_fault_flag(&plan, f);
  if (!o.fault.inject.empty()) add_fault_file(&plan, o.fault.inject);
  validate_fault_plan(plan, world, /*steps=*/0);
  return plan.schedule;
}

int bench_main(const Options& given) {
  Options o = given;
  // Everything keel-bench is given is read and checked before the first run: a mistake in the
  // config or the faults throws keel::InputError, which main reports (exit 2).
  const config::JobConfig cfg = load_config(o.job.config, o.job.set);
  const int world = cfg.parallel().tp() * cfg.parallel().pp() * cfg.parallel().dp();
  if (world % o.slots.workers_per_slot != 0)
    throw InputError(detail::concat("--workers-per-slot ", o.slots.workers_per_slot,
                                    ": the job's world of ", world, " ranks (", o.job.config,
                                    ") is not a multiple of it"));
  const bool given_schedule = !o.fault.inject.empty() || !o.fault.fault.empty();
  const faults::FaultSchedule from_flags =
      given_schedule ? given_faults(o, world) : faults::FaultSchedule();
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec || !std::filesystem::is_directory(o.out))
    throw InputError("--out " + o.out + ": cannot make the directory: " +
                     (ec ? ec.message() : "a file is in the way"));
  o.out = std::filesystem::canonical(o.out).string();
  if (o.slots.local == 0) o.slots.local = world / o.slots.workers_per_slot + o.slots.standby;
  const int64_t steps = cfg.train().steps();
  const double tokens_per_step = double(cfg.train().global_batch_size()) * cfg.model().seq_len();

  BenchReport rep;
  rep.set_config(o.job.config);
  rep.set_steps(int(steps));
  rep.set_local(o.slots.local);
  rep.set_standby(o.slots.standby);
  rep.set_workers_per_slot(o.slots.workers_per_slot);
  for (const std::string& s : o.job.set) rep.add_sets(s);

  // The fault-free run: the reference for the step time, the parameters and the schedule.
  BenchRun clean = launch(o, "fault_free", "hot_swap", "", 0, tokens_per_step, "");
  const double step_s =
      clean.steps_completed() > 0 ? clean.productive_s() / clean.steps_completed() : 0;
  *clean.mutable_lost() = LostTime();  // no incidents; its overhead is start-up (other)
  clean.mutable_lost()->set_other(std::max(0.0, clean.wall_s() - clean.productive_s()));
  rep.set_step_time_s(step_s);
  *rep.add_runs() = clean;
  if (!clean.ok()) {
    write_file(o.out + "/report.json", report_json(rep));
    LOG(ERROR) << "the fault-free run failed: nothing to compare with";
    return 1;
  }

  faults::FaultSchedule schedule = from_flags;
  if (!given_schedule && o.mtbf_s > 0)
    schedule = draw_schedule(o.mtbf_s, step_s, steps, world, o.kinds, o.seed);
  faults::FaultSchedule kept;
  for (const faults::Fault& f : schedule.fault()) {
    if (f.step() < steps) {
      *kept.add_fault() = f;
    } else {
      *rep.add_left_out() = f;
      std::printf("keel-bench: left out %s at step %lld: the job ends at step %lld\n",
                  faults::Fault::Kind_Name(f.kind()).c_str(), static_cast<long long>(f.step()),
                  static_cast<long long>(steps));
    }
  }
  *rep.mutable_schedule() = kept;
  std::string text;
  google::protobuf::TextFormat::PrintToString(kept, &text);
  const std::string sched_path = o.out + "/schedule.pbtxt";
  std::string source = o.fault.inject.empty() ? "" : "--inject " + o.fault.inject;
  for (const std::string& f : o.fault.fault) source += (source.empty() ? "" : " ") + quote(f);
  if (o.mtbf_s > 0)
    source = "--mtbf-s " + std::to_string(o.mtbf_s) + " --seed " + std::to_string(o.seed);
  write_file(sched_path, "# keel-bench's fault schedule (" + source + "); repeat with --inject " +
                             sched_path + "\n" + text);
  std::printf("keel-bench: fault schedule (%s):\n%s", sched_path.c_str(), text.c_str());

  int failed = 0;
  for (const std::string& p : o.policies) {
    BenchRun r = launch(o, p, p, kept.fault_size() ? "--inject " + quote(sched_path) : "", step_s,
                        tokens_per_step, clean.param_checksum());
    failed += r.ok() ? 0 : 1;
    *rep.add_runs() = r;
  }

  write_file(o.out + "/report.json", report_json(rep));
  write_file(o.out + "/report.html", report_html(rep));
  for (const BenchRun& r : rep.runs()) write_run_events(o.out + "/tb/" + r.name(), r, step_s);

  std::printf("\n%-12s %4s %10s %7s %7s %8s %6s %9s %s\n", "run", "ok", "tokens/s", "MFU", "ETTR",
              "wall s", "incid.", "restarts", "bitwise equal");
  for (const BenchRun& r : rep.runs())
    std::printf("%-12s %4s %10.0f %6.2f%% %6.1f%% %8.2f %6d %9d %s\n", r.name().c_str(),
                r.ok() ? "yes" : "NO", r.tokens_per_s(), 100 * r.mfu(), 100 * r.ettr(), r.wall_s(),
                r.incidents_size(), r.lost().restarts(), r.bitwise_equal() ? "yes" : "NO");
  std::printf("\nkeel-bench: %s/report.json, report.html, tb/ (tensorboard --logdir %s/tb)\n",
              o.out.c_str(), o.out.c_str());
  return failed ? 1 : 0;
}

// The policy comparison's and the soak's flags on keel-bench itself.
void add_flags(CLI::App& app, Options* o) {
  cli::add_job_flags(app, &o->job);
  app.add_option("--out", o->out, "where the reports go: report.json, report.html, tb/")
      ->option_text("DIR");
  cli::add_fault_flags(app, &o->fault);
  app.add_option("--mtbf-s", o->mtbf_s,
                 "or: draw faults from a Poisson process, mean T seconds apart (written as a "
                 "FaultSchedule to DIR/schedule.pbtxt, to repeat with --inject); T > 0")
      ->option_text("T")
      ->transform(cli::number_above(0, "seconds"));
  app.add_option("--kinds", o->kinds,
                 "the fault kinds --mtbf-s draws, uniformly, comma-separated: the KINDs of --fault "
                 "(default crash)")
      ->option_text("LIST")
      ->delimiter(',')
      ->check(CLI::IsMember(fault_kind_names()));
  app.add_option("--seed", o->seed, "the seed of the --mtbf-s draw and of the soak (default 1)")
      ->option_text("N")
      ->transform(cli::whole_number(0, INT64_MAX));
  app.add_option("--policies", o->policies,
                 "recovery.mode of the faulty runs: hot_swap, in_place, restart_all, "
                 "comma-separated (default all three)")
      ->option_text("LIST")
      ->delimiter(',')
      ->check(CLI::IsMember({"hot_swap", "in_place", "restart_all"}));
  cli::add_slot_flags(app, &o->slots);
  // keel-bench's defaults differ from keel-launch's: two standbys, so that hot_swap has slots
  // to swap in, and two ranks a slot, as on a machine of several GPUs.
  app.get_option("--standby")
      ->description(
          "the last K slots are warm standbys, which replace a lost or evicted slot "
          "(default 2)");
  app.get_option("--workers-per-slot")->description("ranks per slot (default 2)");
  app.get_option("--local")->description("slots on this machine (default world / W + K)");
  // The readable checks of runtime/cli.h, run before the shared flags' own (transform() puts
  // them first), so that keel-bench says the range in the words of its other flags.
  app.get_option("--local")->transform(cli::whole_number(1, cli::kMaxCount));
  app.get_option("--standby")->transform(cli::whole_number(0, cli::kMaxCount));
  app.get_option("--workers-per-slot")->transform(cli::whole_number(1, cli::kMaxCount));
  app.add_option("--persistent-every", o->persistent_every,
                 "checkpoint.persistent_every_steps of every run, which restart_all restores "
                 "from (default 50)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxCheckpointEvery));
  app.add_flag("--persistent-restart-all-only", o->persistent_restart_all_only,
               "only the restart_all runs write persistent checkpoints");
  app.add_option("--soak", o->soak,
                 "instead: run the job through N mixed faults and check that nothing is lost "
                 "(bench/soak.h; writes DIR/soak.json)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxSoakFaults));
  app.add_option("--soak-machines", o->soak_machines,
                 "where the soak's slots run: netns, a network namespace each, so that "
                 "partitions join the mix (needs root and iproute2); local, all on this "
                 "machine; auto, netns where it can (default)")
      ->option_text("WHERE")
      ->check(CLI::IsMember({"auto", "local", "netns"}));
  app.add_option("--soak-kill-controller-every", o->soak_kill_controller_every_s,
                 "the soak kills the leader controller (kill -9 of the PID its election names) "
                 "this often, once the previous kill was taken over (0 to 3600; default 30; 0: "
                 "never)")
      ->option_text("S")
      ->transform(cli::number(0, 3600, "seconds"));
  app.add_option("--soak-etcd", o->soak_etcd,
                 "where the soak's job keeps its control state: job, the etcd members "
                 "keel-launch starts on the job's own slots, lost and replaced with the "
                 "machines (default); own, a cluster of 3 on the host beside the machines "
                 "(--etcd, as a site runs etcd on service nodes)")
      ->option_text("job|own")
      ->check(CLI::IsMember({"job", "own"}));
}

int soak(const Options& o) {
  return soak_main({.config = o.job.config,
                    .sets = o.job.set,
                    .out = o.out,
                    .faults = o.soak,
                    .local = o.slots.local,
                    .standby = o.slots.standby,
                    .workers_per_slot = o.slots.workers_per_slot,
                    .seed = o.seed,
                    .machines = o.soak_machines == "netns"   ? SoakMachines::kNetns
                                : o.soak_machines == "local" ? SoakMachines::kLocal
                                                             : SoakMachines::kAuto,
                    .kill_controller_every_s = o.soak_kill_controller_every_s,
                    .own_etcd = o.soak_etcd == "own"});
}

int main(int argc, char** argv) {
  CLI::App app(
      "keel-bench: MFU and ETTR of a job under a fault schedule, per recovery policy.\n"
      "Runs the job fault-free once, then under the schedule (--inject, --fault or --mtbf-s)\n"
      "once per policy, each with keel-launch, and writes DIR/report.json, DIR/report.html\n"
      "and TensorBoard event files under DIR/tb/. The subcommands are the developer\n"
      "benchmarks (their results: bench/RESULTS.md) and the projection to scale; each has\n"
      "its own --help.",
      "keel-bench");
  Options o;
  add_flags(app, &o);
  const std::vector<Command> commands = {add_cpu_command(app),     add_recovery_command(app),
                                         add_detect_command(app),  add_sdc_command(app),
                                         add_restore_command(app), add_reshard_command(app),
                                         add_project_command(app), add_control_plane_command(app)};
  app.require_subcommand(0, 1);
  if (const auto rc = cli::parse(app, argc, argv)) return *rc;
  try {
    for (const Command& c : commands) {
      if (!c.app->parsed()) continue;
      for (const CLI::Option* opt : app.get_options())
        if (opt->count() > 0 && opt != app.get_help_ptr())
          return cli::usage_error(app, opt->get_name() + " is keel-bench's own flag, not " +
                                           c.app->get_name() +
                                           "'s: give it without the subcommand");
      return c.run();
    }
    if (o.mtbf_s > 0 && (!o.fault.inject.empty() || !o.fault.fault.empty()))
      return cli::usage_error(app,
                              "--mtbf-s draws the faults: give it without --inject and --fault");
    if (o.soak > 0 && (o.mtbf_s > 0 || !o.fault.inject.empty() || !o.fault.fault.empty()))
      return cli::usage_error(
          app, "--soak draws its own faults: give it without --inject, --fault, --mtbf-s");
    for (const char* f :
         {"--policies", "--kinds", "--persistent-every", "--persistent-restart-all-only"})
      if (o.soak > 0 && app.count(f) > 0)
        return cli::usage_error(
            app, std::string("--soak runs one policy (recovery.mode of the config, ") +
                     "hot_swap by default) without persistent checkpoints: " + f +
                     " does not apply");
    if (o.soak == 0 && app.count("--soak-machines") > 0)
      return cli::usage_error(app, "--soak-machines is an option of --soak N");
    if (o.soak > 0 && (o.job.config.empty() || o.out.empty()))
      return cli::usage_error(app, "--soak needs --config and --out");
    if (o.soak > 0) return soak(o);
    if (o.job.config.empty() || o.out.empty())
      return cli::usage_error(app, "--config and --out are required");
    return bench_main(o);
  } catch (const InputError& e) {
    // Bad input found past the command line (a config, a fault schedule, --out): one line, as
    // keel-launch and keel-ctl say theirs.
    std::fprintf(stderr, "keel-bench: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-bench: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace
}  // namespace keel::bench

int main(int argc, char** argv) {
  keel::init_logging(argv[0]);
  return keel::bench::main(argc, argv);
}
