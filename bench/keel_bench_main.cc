// keel-bench: MFU and ETTR of a job under a fault schedule, per recovery policy, in one
// command. It runs the job fault-free once, then under the schedule once per policy (the same
// seed and schedule each time), each with keel-launch, and writes DIR/report.json,
// DIR/report.html and TensorBoard event files DIR/tb/<run>/ (see README, "Benchmark MFU under
// faults").
//
//   keel-bench --config C [--inject SCHEDULE | --mtbf-s T --kinds crash,hang,... --seed N]
//              [--policies hot_swap,in_place,restart_all] [--local N --standby K
//              --workers-per-slot W] [--persistent-every N] [--set key=value ...] --out DIR
//   keel-bench project ...   (bench/projection.h)
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
#include "bench/fault_draw.h"
#include "bench/report_html.h"
#include "bench/tfevents.h"
#include "proto/bench.pb.h"
#include "proto/config_loader.h"
#include "proto/faults.pb.h"
#include "runtime/text.h"

#ifdef KEEL_BENCH_HAS_PROJECTION
#include "bench/projection.h"
#endif

namespace keel::bench {
namespace {

struct Options {
  std::string config, inject, out;
  double mtbf_s = 0;
  std::vector<std::string> kinds = {"crash"};
  uint64_t seed = 1;
  std::vector<std::string> policies = {"hot_swap", "in_place", "restart_all"};
  int local = 0, standby = 2, workers_per_slot = 2, persistent_every = 50;
  bool persistent_all = true;
  std::vector<std::string> sets;
};

constexpr const char* kUsage =
    "usage: keel-bench --config FILE --out DIR [options]\n"
    "       keel-bench project [options]   (the expected ETTR at scale; project --help)\n"
    "Runs the job fault-free once, then under a fault schedule once per recovery policy, each\n"
    "with keel-launch, and writes DIR/report.json, DIR/report.html and DIR/tb/<run>/ "
    "(TensorBoard).\n"
    "  --config FILE           job config (text protobuf, proto/config.proto)\n"
    "  --out DIR               where the reports go\n"
    "  --inject FILE           the fault schedule (text protobuf FaultSchedule, "
    "proto/faults.proto)\n"
    "  --mtbf-s T              or: draw faults from a Poisson process, mean T seconds apart\n"
    "  --kinds K1,K2,...       the kinds drawn with --mtbf-s, uniformly (default crash)\n"
    "  --seed N                the draw's seed (default 1)\n"
    "  --policies P1,P2,...    recovery.mode of the faulty runs (default hot_swap,in_place,\n"
    "                          restart_all)\n"
    "  --local N               slots (default world / W + K)\n"
    "  --standby K             warm standby slots (default 2)\n"
    "  --workers-per-slot W    ranks per slot (default 2)\n"
    "  --persistent-every N    checkpoint.persistent_every_steps of every run (default 50);\n"
    "                          restart_all restores from these\n"
    "  --persistent-restart-all-only\n"
    "                          only the restart_all runs write persistent checkpoints\n"
    "  --set PATH=VALUE        a config override, passed to every run (repeatable)\n";

// Parses argv into *o; returns an exit status to end with (-1: go on).
int parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--persistent-restart-all-only") {
      o->persistent_all = false;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "keel-bench: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    const std::string v = argv[++i];
    try {
      if (a == "--config")
        o->config = v;
      else if (a == "--out")
        o->out = v;
      else if (a == "--inject")
        o->inject = v;
      else if (a == "--mtbf-s")
        o->mtbf_s = std::stod(v);
      else if (a == "--kinds")
        o->kinds = split(v, ',', /*skip_empty=*/true);
      else if (a == "--seed")
        o->seed = std::stoull(v);
      else if (a == "--policies")
        o->policies = split(v, ',', /*skip_empty=*/true);
      else if (a == "--local")
        o->local = std::stoi(v);
      else if (a == "--standby")
        o->standby = std::stoi(v);
      else if (a == "--workers-per-slot")
        o->workers_per_slot = std::stoi(v);
      else if (a == "--persistent-every")
        o->persistent_every = std::stoi(v);
      else if (a == "--set")
        o->sets.push_back(v);
      else {
        std::fprintf(stderr, "keel-bench: unknown flag %s\n%s", a.c_str(), kUsage);
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "keel-bench: %s: not a number: %s\n", a.c_str(), v.c_str());
      return 2;
    }
  }
  std::string why;
  if (o->config.empty() || o->out.empty())
    why = "--config and --out are required";
  else if (!o->inject.empty() && o->mtbf_s > 0)
    why = "--inject and --mtbf-s exclude each other";
  else if (o->mtbf_s < 0)
    why = "--mtbf-s must be positive";
  else if (o->workers_per_slot < 1 || o->standby < 0)
    why = "bad --workers-per-slot or --standby";
  else if (o->policies.empty())
    why = "--policies is empty";
  else if (o->persistent_every < 1)
    why = "--persistent-every must be positive";
  for (const std::string& p : o->policies)
    if (p != "hot_swap" && p != "in_place" && p != "restart_all")
      why = "unknown policy " + p + " (hot_swap, in_place, restart_all)";
  for (const std::string& k : o->kinds) {
    faults::Fault::Kind kind;
    if (!faults::Fault::Kind_Parse(k, &kind)) why = "unknown fault kind " + k;
  }
  if (!why.empty()) {
    std::fprintf(stderr, "keel-bench: %s\n%s", why.c_str(), kUsage);
    return 2;
  }
  return -1;
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
  std::string a = "--config " + quote(o.config) + " --local " + std::to_string(o.local) +
                  " --standby " + std::to_string(o.standby) + " --workers-per-slot " +
                  std::to_string(o.workers_per_slot);
  for (const std::string& s : o.sets) a += " --set " + quote(s);
  const bool persistent = policy == "restart_all" || o.persistent_all;
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
  b.set_started_at(started);
  b.set_run_dir(dir);
  if (!b.ok())
    std::fprintf(stderr, "keel-bench: %s failed (exit %d; see %s/run.log)\n", name.c_str(), rc,
                 dir.c_str());
  return b;
}

// Cumulative ETTR after each kept step: its share of kept time (the mean kept step) over the
// time since the job's start.
void write_events(const std::string& dir, const BenchRun& r, int first_step, double step_s) {
  EventWriter w(dir);
  for (int i = 0; i < r.losses_size() && i < r.step_end_s_size(); ++i) {
    const int64_t step = first_step + i;
    const double t = r.started_at() + r.step_end_s(i);
    w.scalar("loss", step, t, r.losses(i));
    w.scalar("mfu", step, t, r.step_mfu(i));
    w.scalar("tokens_per_s", step, t, r.step_tokens_per_s(i));
    const double kept = r.steps_completed() > 0 ? r.productive_s() / r.losses_size() : step_s;
    w.scalar("ettr", step, t,
             r.step_end_s(i) > 0 ? std::min(1.0, (i + 1) * kept / r.step_end_s(i)) : 0);
  }
  w.close();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  f.close();
  if (f.fail()) throw std::runtime_error("cannot write " + path);
}

int bench_main(const Options& given) {
  Options o = given;
  std::filesystem::create_directories(o.out);
  o.out = std::filesystem::canonical(o.out).string();
  const config::JobConfig cfg = load_config(o.config, o.sets);
  const int world = cfg.parallel().tp() * cfg.parallel().pp() * cfg.parallel().dp();
  if (world % o.workers_per_slot != 0) {
    std::fprintf(stderr, "keel-bench: world %d is not a multiple of --workers-per-slot %d\n", world,
                 o.workers_per_slot);
    return 2;
  }
  if (o.local == 0) o.local = world / o.workers_per_slot + o.standby;
  const int64_t steps = cfg.train().steps();
  const double tokens_per_step = double(cfg.train().global_batch_size()) * cfg.model().seq_len();

  BenchReport rep;
  rep.set_config(o.config);
  rep.set_steps(int(steps));
  rep.set_local(o.local);
  rep.set_standby(o.standby);
  rep.set_workers_per_slot(o.workers_per_slot);
  for (const std::string& s : o.sets) rep.add_sets(s);

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
    std::fprintf(stderr, "keel-bench: the fault-free run failed: nothing to compare with\n");
    return 1;
  }

  faults::FaultSchedule schedule;
  if (!o.inject.empty()) {
    std::ifstream in(o.inject);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    if (!in || !google::protobuf::TextFormat::ParseFromString(text, &schedule)) {
      std::fprintf(stderr, "keel-bench: %s is not a FaultSchedule text protobuf\n",
                   o.inject.c_str());
      return 2;
    }
  } else if (o.mtbf_s > 0) {
    schedule = draw_schedule(o.mtbf_s, step_s, steps, world, o.kinds, o.seed);
  }
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
  write_file(sched_path, "# keel-bench's fault schedule (" +
                             (o.mtbf_s > 0 ? "--mtbf-s " + std::to_string(o.mtbf_s) + " --seed " +
                                                 std::to_string(o.seed)
                                           : "--inject " + o.inject) +
                             "); repeat with --inject " + sched_path + "\n" + text);
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
  for (const BenchRun& r : rep.runs()) write_events(o.out + "/tb/" + r.name(), r, 0, step_s);

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

}  // namespace
}  // namespace keel::bench

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "project") {
#ifdef KEEL_BENCH_HAS_PROJECTION
    return keel::bench::project_main(argc, argv);
#else
    std::fprintf(stderr, "keel-bench project: not built\n");
    return 2;
#endif
  }
  keel::bench::Options o;
  if (const int rc = keel::bench::parse(argc, argv, &o); rc >= 0) return rc;
  try {
    return keel::bench::bench_main(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-bench: %s\n", e.what());
    return 2;
  }
}
