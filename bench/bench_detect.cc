// keel-bench detect: how fast keel-launch notices each kind of failure across slots, and what
// the control plane costs a step, measured in one invocation (bench/RESULTS.md records the
// output). The tiny TP2×PP2×DP2 job (8 ranks), 2 workers per slot, so 4 slots:
//   1. control-plane overhead: the same fault-free run under keel-worker --nproc 8 and under
//      keel-launch --local 4, interleaved pairs, median step time of each and their ratio;
//   2. detection latency per fault kind (detected_at − injected_at), and the time from the
//      injection to the first step after it where the job goes on:
//      - crash, exit, hang, freeze, spin, hang_in_collective: `--injections` faults in one
//        keel-launch --local run, recovered in place (incidents of the run's report);
//      - sigstop: `--injections` workers SIGSTOPped from outside (a PID found in /proc) in
//        one run, each after the job recovered from the one before;
//      - slot_loss: one run per injection (detect.on_slot_loss = fail ends the job), the
//        latency from the controller's `slot_lost` event;
//      - partition: as slot_loss, but the 4 slots are network namespaces (machines, one
//        keel-launch each: slot 0 with --slots 4, the others --join) and the slot's link goes
//        down; needs root and iproute2, otherwise reported as not measured.
//
//   3. failover (bench/detect_failover.h): a controller crash, slot 0 lost, a slot lost by
//      its processes' death and by its silence, in a job with etcd, hot swapped;
//   4. fail-slow (bench/detect_slow.h): rounds to detection at 1.5x, 2x, 4x slowdowns, and
//      false positives per 1,000 fault-free steps.
//
//   keel-bench detect [--injections 10] [--pairs 3] [--steps 200] [--kinds crash,exit,...]
#include <signal.h>
#include <sys/wait.h>

#include <google/protobuf/struct.pb.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/detect_failover.h"
#include "bench/detect_slow.h"
#include "bench/scenarios.h"
#include "integration/netns.h"
#include "model/token_shards.h"
#include "proto/report.pb.h"
#include "runtime/logging.h"

namespace keel {
namespace {

using bench::event_number;
using bench::exe_dir;
using bench::job_dir_in;
using bench::must_run;
using bench::parse_event;
using bench::random_shards;
using bench::read_controller_file;
using bench::read_report;
using bench::run;

namespace fs = std::filesystem;

constexpr int kRanks = 8, kPerSlot = 2, kSlots = kRanks / kPerSlot;
constexpr double kTokensPerStep = 16 * 64;  // global batch × seq_len of the tiny job

std::string tiny3d(const std::string& dir, const std::string& shards, int steps) {
  const std::string cfg = dir + "/tiny3d-" + std::to_string(steps) + ".pbtxt";
  std::ofstream(cfg) << "model { plugin: \"" << exe_dir()
                     << "/libkeel_gpt.so\" num_layers: 2 hidden_size: 64 num_heads: 4 "
                        "seq_len: 64 vocab_size: 256 }\n"
                     << "train { micro_batch_size: 2 global_batch_size: 16 steps: " << steps
                     << " }\nparallel { tp: 2 pp: 2 dp: 2 }\n"
                     << "data { train_files: \"" << shards << "\" }\nruntime { threads: 1 }\n";
  return cfg;
}

// The detector under test, not the communicator's timeout, must be what ends a hang.
const std::string kSets =
    " --set parallel.comm_timeout_ms=60000 "
    "--set detect.slot_timeout_ms=2000";

// The one job directory under dir/runs (empty if none).
// The controller's `slot_lost` event: the seconds from the injection to the slot declared
// lost (-1 when absent), and the kind it was labelled with.
double slot_lost_after(const std::string& job, std::string* kind) {
  std::ifstream in(job + "/events.jsonl");
  events::Event e;
  for (std::string line; std::getline(in, line);) {
    if (!parse_event(line, &e) || e.kind() != "slot_lost") continue;
    const auto& data = e.data().fields();
    if (data.count("kind")) *kind = data.at("kind").string_value();
    return event_number(e, "after_injection_s");
  }
  return -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double worst(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

double step_time(const report::RunReport& r) {
  // tokens_per_s leaves out the first step (warm-up).
  return r.tokens_per_s() > 0 ? kTokensPerStep / r.tokens_per_s() : 0;
}

// Returns the median step time under keel-launch (for the hang target).
double bench_overhead(const std::string& dir, const std::string& shards, int steps, int pairs) {
  const std::string cfg = tiny3d(dir, shards, steps);
  std::printf(
      "== control-plane overhead: the tiny TP2xPP2xDP2 job, %d steps, fault-free, %d pairs "
      "interleaved\n",
      steps, pairs);
  std::printf("%-5s %-28s %12s %10s %s\n", "pair", "runner", "step s", "wall s", "params");
  std::vector<double> worker, launch;
  for (int p = 0; p < pairs; ++p)
    for (const std::string program : {"keel-worker", "keel-launch"}) {
      const bool l = program == "keel-launch";
      report::RunReport r = must_run(dir, program,
                                     (l ? "--local " + std::to_string(kSlots) +
                                              " --workers-per-slot " + std::to_string(kPerSlot)
                                        : "--nproc " + std::to_string(kRanks)) +
                                         " --config " + cfg + kSets);
      (l ? launch : worker).push_back(step_time(r));
      std::printf("%-5d %-28s %12.5f %10.2f %s\n", p + 1,
                  l ? "keel-launch --local 4 (W=2)" : "keel-worker --nproc 8", step_time(r),
                  r.wall_s(), r.param_checksum().c_str());
      std::fflush(stdout);
    }
  const double w = median(worker), l = median(launch);
  std::printf(
      "median step: keel-worker --nproc %.5f s, keel-launch --local %.5f s: ratio %.4f "
      "(%+.2f%%); target within 2%%: %s\n",
      w, l, l / w, 100 * (l / w - 1), std::abs(l / w - 1) <= 0.02 ? "met" : "NOT MET");
  return l;
}

struct KindResult {
  std::string kind, target, note;
  int injected = 0;
  std::vector<double> detect, first_step;
  double limit = 0;  // the target, seconds
};

void print_header() {
  std::printf("%-18s %10s %10s %14s %12s %18s %-16s %s\n", "kind", "injected", "detected",
              "median det s", "worst det s", "median to step s", "target", "met");
}

void print(const KindResult& k) {
  if (k.detect.empty()) {
    std::printf("%-18s %10d %10d %14s %12s %18s %-16s %s\n", k.kind.c_str(), k.injected, 0, "-",
                "-", "-", k.target.c_str(), ("not measured: " + k.note).c_str());
  } else {
    const double m = median(k.detect);
    char to_step[32] = "-";
    if (!k.first_step.empty())
      std::snprintf(to_step, sizeof(to_step), "%.3f", median(k.first_step));
    std::printf("%-18s %10d %10zu %14.3f %12.3f %18s %-16s %s%s\n", k.kind.c_str(), k.injected,
                k.detect.size(), m, worst(k.detect), to_step, k.target.c_str(),
                m <= k.limit ? "met" : "NOT MET", k.note.empty() ? "" : ("; " + k.note).c_str());
  }
  std::fflush(stdout);
}

// crash, exit or hang: `n` injections, one every 20 steps on ranks 1..7 in turn, in one run
// recovered in place.
KindResult in_run(const std::string& dir, const std::string& shards, const std::string& kind,
                  int n) {
  const int every = 20, steps = every * (n + 1);
  const std::string cfg = tiny3d(dir, shards, steps);
  std::string faults;
  for (int k = 0; k < n; ++k) {
    faults += " --fault " + kind + "@step=" + std::to_string(every * (k + 1)) +
              ",rank=" + std::to_string(1 + k % (kRanks - 1));
    if (kind == "exit") faults += ",code=3,message=bench";
  }
  KindResult res;
  res.kind = kind;
  res.injected = n;
  report::RunReport r = must_run(dir, "keel-launch",
                                 "--local " + std::to_string(kSlots) + " --workers-per-slot " +
                                     std::to_string(kPerSlot) + " --config " + cfg + kSets +
                                     " --set recovery.mode=in_place --set recovery.max_incidents=" +
                                     std::to_string(n + 5) + faults);
  // The hang kinds are all reported as hangs (the rule that found them is in the incident).
  const std::string reported =
      kind == "freeze" || kind == "spin" || kind == "hang_in_collective" ? "hang" : kind;
  int other = 0;
  for (const auto& inc : r.incidents()) {
    if (inc.kind() != reported || inc.injected_at() <= 0) {
      ++other;
      continue;
    }
    res.detect.push_back(inc.detected_at() - inc.injected_at());
    if (inc.first_step_at() > 0) res.first_step.push_back(inc.first_step_at() - inc.injected_at());
  }
  if (other > 0) res.note = std::to_string(other) + " other incident(s) in the run";
  return res;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// sigstop: one run; `n` times, a worker (ranks 1..7 in turn) is SIGSTOPped from outside,
// each 1 s after the job's first step after the previous one. Its agent kills it once it is
// found; the job restarts it in place.
KindResult sigstop(const std::string& dir, const std::string& shards, int n, double step) {
  const int steps = int(std::max(200.0, (n * 4.0 + 10) / std::max(step, 0.005)));
  const std::string cfg = tiny3d(dir, shards, steps);
  KindResult res;
  res.kind = "sigstop";
  std::vector<double> stopped;
  std::thread job([&] {
    run(dir, "keel-launch",
        "--local " + std::to_string(kSlots) + " --workers-per-slot " + std::to_string(kPerSlot) +
            " --config " + cfg + kSets +
            " --set recovery.mode=in_place --set recovery.max_incidents=" + std::to_string(n + 5));
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  pid_t last = 0;
  for (int k = 0; k < n && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const pid_t p = bench::worker_pid(1 + k % (kRanks - 1));
    if (p == 0 || p == last) continue;  // not started yet, or the stopped one not yet replaced
    if (::kill(p, SIGSTOP) != 0) continue;
    stopped.push_back(unix_now());
    last = p;
    ++res.injected;
    ++k;
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  job.join();
  report::RunReport r;
  if (!read_report(dir + "/report.json", &r)) {
    res.note = "the run wrote no report (see " + dir + "/run.log)";
    return res;
  }
  size_t i = 0;
  for (const auto& inc : r.incidents()) {
    if (inc.kind() != "hang" || i >= stopped.size()) continue;
    res.detect.push_back(inc.detected_at() - stopped[i]);
    if (inc.first_step_at() > 0) res.first_step.push_back(inc.first_step_at() - stopped[i]);
    ++i;
  }
  return res;
}

// slot_loss under --local: one run per injection (the job ends on a lost slot), at steps
// 10, 12, ... on ranks 2..7 (slots 1..3) in turn.
KindResult slot_loss(const std::string& dir, const std::string& shards, int n) {
  const std::string cfg = tiny3d(dir, shards, 60);
  KindResult res;
  res.kind = "slot_loss";
  for (int k = 0; k < n; ++k) {
    const std::string fault = "slot_loss@step=" + std::to_string(10 + 2 * (k % 10)) +
                              ",rank=" + std::to_string(kPerSlot + k % (kRanks - kPerSlot));
    run(dir, "keel-launch",
        "--local " + std::to_string(kSlots) + " --workers-per-slot " + std::to_string(kPerSlot) +
            " --config " + cfg + kSets + " --fault " + fault);
    ++res.injected;
    std::string seen;
    const double d = slot_lost_after(job_dir_in(dir + "/runs"), &seen);
    if (d >= 0 && seen == "slot_loss")
      res.detect.push_back(d);
    else
      LOG(WARNING) << fault << ": no slot_lost event for it (see " << dir << "/run.log)";
  }
  return res;
}

// partition over network namespaces: one lab and one run per injection.
KindResult partition(const std::string& dir, const std::string& shards, int n) {
  KindResult res;
  res.kind = "partition";
  std::string why;
  if (!test::NetnsLab::available(&why)) {
    res.note = why;
    return res;
  }
  const std::string cfg = tiny3d(dir, shards, 60);
  const std::string launch = exe_dir() + "/keel-launch";
  std::vector<std::string> sets;
  std::istringstream words(kSets);
  for (std::string w; words >> w;) sets.push_back(w);
  for (int k = 0; k < n; ++k) {
    const std::string fault = "partition@step=" + std::to_string(10 + 2 * (k % 10)) +
                              ",rank=" + std::to_string(kPerSlot + k % (kRanks - kPerSlot));
    fs::remove_all(dir + "/runs");
    fs::create_directories(dir + "/runs");
    ++res.injected;
    try {
      test::NetnsLab lab(kSlots);
      const std::vector<std::string> env = {"KEEL_IFNAME=" + lab.ifname()};
      std::vector<std::string> argv0 = {launch,
                                        "--slots",
                                        std::to_string(kSlots),
                                        "--workers-per-slot",
                                        std::to_string(kPerSlot),
                                        "--config",
                                        cfg,
                                        "--run-dir",
                                        dir + "/runs",
                                        "--quiet",
                                        "--fault",
                                        fault};
      argv0.insert(argv0.end(), sets.begin(), sets.end());
      const pid_t slot0 = lab.spawn(0, argv0, env, dir + "/slot0.log");
      // The controller's endpoint and job id, once slot 0 has written them.
      std::string endpoint, job;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (std::chrono::steady_clock::now() < deadline) {
        const std::string jd = job_dir_in(dir + "/runs");
        if (!jd.empty() && read_controller_file(jd, &endpoint, &job)) break;
        job.clear();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (job.empty()) throw std::runtime_error("slot 0 wrote no controller file (see slot0.log)");
      for (int s = 1; s < kSlots; ++s) {
        std::vector<std::string> argv = {launch,
                                         "--join",
                                         endpoint,
                                         "--slot",
                                         std::to_string(s),
                                         "--job",
                                         job,
                                         "--config",
                                         cfg,
                                         "--run-dir",
                                         dir + "/runs",
                                         "--workers-per-slot",
                                         std::to_string(kPerSlot),
                                         "--quiet"};
        argv.insert(argv.end(), sets.begin(), sets.end());
        lab.spawn(s, argv, env, dir + "/slot" + std::to_string(s) + ".log");
      }
      // Slot 0 ends the job once the slot is declared lost (detect.on_slot_loss = fail).
      int st = 0;
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (waitpid(slot0, &st, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > end) {
          kill(-slot0, SIGKILL);
          waitpid(slot0, &st, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      std::string seen;
      const double d = slot_lost_after(job_dir_in(dir + "/runs"), &seen);
      if (d >= 0 && seen == "partition")
        res.detect.push_back(d);
      else
        LOG(WARNING) << fault << ": no slot_lost event labelled partition (saw '" << seen
                     << "'; see " << dir << "/slot*.log)";
    } catch (const std::exception& e) {
      LOG(WARNING) << fault << ": " << e.what();
    }
  }
  if (res.detect.empty() && res.note.empty()) res.note = "no run detected it (see stderr)";
  return res;
}

// Every row keel-bench detect can measure, in the order it measures them.
const std::vector<std::string> kAllKinds = [] {
  std::vector<std::string> k = {
      "overhead",           "crash",   "exit",      "hang",     "freeze", "spin",
      "hang_in_collective", "sigstop", "slot_loss", "partition"};
  for (const auto& f : bench::failover_kinds()) k.push_back(f);
  k.push_back("slow");
  return k;
}();

struct DetectOptions {
  int injections = 10, pairs = 3, steps = 200;
  std::vector<std::string> kinds = kAllKinds;
};

int detect_main(const DetectOptions& o) {
  const int injections = o.injections, pairs = o.pairs, steps = o.steps;
  auto want = [&](const std::string& k) {
    return std::find(o.kinds.begin(), o.kinds.end(), k) != o.kinds.end();
  };
  const std::string dir = fs::temp_directory_path() / "keel-bench-detect";
  fs::create_directories(dir);
  const std::string shards = random_shards(fs::temp_directory_path() / "keel-bench-data");
  double step = 0;
  if (want("overhead") && pairs > 0) step = bench_overhead(dir, shards, steps, pairs);

  bool latency = false;
  for (const char* k : {"crash", "exit", "hang", "freeze", "spin", "hang_in_collective", "sigstop",
                        "slot_loss", "partition"})
    latency |= want(k);
  if (latency)
    std::printf(
        "\n== detection latency: the tiny TP2xPP2xDP2 job under keel-launch, %d slots x %d "
        "workers; detected_at - injected_at; crash/exit/hang: %d injections in one run each, "
        "recovered in place; slot_loss (--local) and partition (network namespaces): one run per "
        "injection, detect.on_slot_loss = fail\n",
        kSlots, kPerSlot, injections);
  if (latency) print_header();
  if (want("crash")) {
    KindResult k = in_run(dir, shards, "crash", injections);
    k.target = "<= 0.5 s";
    k.limit = 0.5;
    print(k);
  }
  if (want("exit")) {
    KindResult k = in_run(dir, shards, "exit", injections);
    k.target = "<= 0.5 s";
    k.limit = 0.5;
    print(k);
  }
  if (want("hang")) {
    KindResult k = in_run(dir, shards, "hang", injections);
    k.target = "<= 2 steps + 2 s";
    k.limit = 2 * step + 2.0;
    if (step > 0) {
      char n[64];
      std::snprintf(n, sizeof(n), "target = %.3f s at %.4f s/step", k.limit, step);
      k.note = k.note.empty() ? n : k.note + "; " + n;
    }
    print(k);
  }
  for (const std::string kind : {"freeze", "spin", "hang_in_collective", "sigstop"}) {
    if (!want(kind)) continue;
    KindResult k = kind == "sigstop" ? sigstop(dir, shards, injections, step)
                                     : in_run(dir, shards, kind, injections);
    k.target = "<= 2 steps + 2 s";
    k.limit = 2 * step + 2.0;
    print(k);
  }
  if (want("slot_loss")) {
    KindResult k = slot_loss(dir, shards, injections);
    k.target = "<= 2 s";
    k.limit = 2.0;
    print(k);
  }
  if (want("partition")) {
    KindResult k = partition(dir, shards, injections);
    k.target = "<= 2 s";
    k.limit = 2.0;
    print(k);
  }
  std::vector<std::string> failover;
  for (const auto& f : bench::failover_kinds())
    if (want(f)) failover.push_back(f);
  bench::failover_rows(
      dir, [&](int n) { return tiny3d(dir, shards, n); }, kSets, failover, injections);
  if (want("slow"))
    bench::fail_slow_rows(
        dir, [&](int n) { return tiny3d(dir, shards, n); }, kSets, 1000);
  return 0;
}

}  // namespace

namespace bench {

Command add_detect_command(CLI::App& app) {
  auto o = std::make_shared<DetectOptions>();
  CLI::App* sub = app.add_subcommand(
      "detect", "keel-launch's detection latency per fault kind and its cost per step");
  sub->add_option("--injections", o->injections, "faults injected per kind (default 10)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxRepeats));
  sub->add_option("--pairs", o->pairs,
                  "interleaved (keel-worker, keel-launch) pairs of the overhead row (default 3; "
                  "0 skips it)")
      ->option_text("N")
      ->transform(cli::whole_number(0, kMaxRepeats));
  sub->add_option("--steps", o->steps, "steps of each overhead run (default 200)")
      ->option_text("N")
      ->transform(cli::whole_number(1, kMaxSteps));
  std::string all;
  for (const std::string& k : kAllKinds) all += (all.empty() ? "" : ", ") + k;
  sub->add_option("--kinds", o->kinds,
                  "the rows to measure, comma-separated: " + all + " (default all)")
      ->option_text("LIST")
      ->delimiter(',')
      ->check(CLI::IsMember(kAllKinds));
  return {sub, [o] { return detect_main(*o); }};
}

}  // namespace bench
}  // namespace keel
