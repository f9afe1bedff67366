#include "bench/detect_failover.h"

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "bench/bench_util.h"
#include "bench/job_in_etcd.h"
#include "launcher/control_plane.h"
#include "launcher/run_dir_finder.h"

namespace keel::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The slot the swap rows lose: slot 3 (ranks 6, 7), which runs no etcd member, so that they
// measure the detection and the swap alone. Losing a member's slot costs more when that
// member led etcd's Raft: every write waits for etcd's election (about 1 s), as slot0_loss
// shows.
constexpr int kSwapRank = 6;

// The job of every trial: 4 slots with ranks and a warm standby, hot swap; paced (rank 7
// sleeps 10 ms a step, numbers unchanged) so that an injection from outside lands well
// before the end.
std::string job_args(const std::string& cfg, const std::string& sets) {
  return "--local 5 --standby 1 --workers-per-slot 2 --config " + cfg + sets +
         " --set recovery.mode=hot_swap --set recovery.max_incidents=5"
         " --fault slow@step=0,rank=7,delay_ms=10 --set detect.slow_round_steps=0";
}
// Steps of a run with a fault injected by keel (at step 100) and of one acted on from outside
// (from step 50; a takeover takes some 5 s).
constexpr int kFaultSteps = 300, kOutsideSteps = 800, kActAtStep = 50;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One trial's figures, seconds from the injection (-1: not seen).
struct Trial {
  double detected = -1, first_step = -1, stall = -1;
};

// The events of the job in `job_dir` so far.
std::vector<events::Event> events_of(const std::string& job_dir) {
  std::vector<events::Event> all;
  std::ifstream in(job_dir + "/events.jsonl");
  events::Event e;
  for (std::string line; std::getline(in, line);)
    if (parse_event(line, &e)) all.push_back(e);
  return all;
}

const events::Event* find(const std::vector<events::Event>& all, const std::string& kind) {
  for (const auto& e : all)
    if (e.kind() == kind) return &e;
  return nullptr;
}

// The first step completed after `t` (unix seconds), and the longest gap between two steps
// completed within 30 s of it (the step in flight at `t` included).
void steps_after(const report::RunReport& r, double t, Trial* out) {
  double prev = r.job_start_at();
  for (double s : r.step_end_s()) {
    const double end = r.job_start_at() + s;
    if (!(s > 0)) continue;  // a step without record (NaN) says nothing of the stall
    if (end > t && out->first_step < 0) out->first_step = end - t;
    if (end > t && prev < t + 30) out->stall = std::max(out->stall, end - prev);
    prev = end;
  }
}

// Runs keel-launch with `args` in `dir` (its own: a trial's) and calls `act` with the job's
// run directory every 20 ms until it returns true or the job ends; returns the report (none
// if the run wrote none).
std::optional<report::RunReport> run_acting(const std::string& dir, const std::string& args,
                                            const std::function<bool(const std::string&)>& act) {
  std::atomic<bool> done{false};
  std::thread job([&] {
    run(dir, "keel-launch", args);
    done = true;
  });
  bool acted = !act;
  while (!done) {
    const std::string job_dir = job_dir_in(dir + "/runs");
    if (!acted && !job_dir.empty()) acted = act(job_dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  job.join();
  report::RunReport r;
  if (!read_report(dir + "/report.json", &r)) return std::nullopt;
  return r;
}

// The step the job has reached, as its controller's status answer says (what keel-ctl status
// prints; -1: not known yet).
int job_step(const std::string& job_dir) {
  try {
    const FoundRun run = read_run(job_dir);
    if (run.end_code || run.endpoint.empty() || !run.key) return -1;
    set_process_job_key(*run.key);  // the control plane admits the job's keys only
    ControlClient c(run.endpoint, "bench/" + std::to_string(getpid()));
    control::Envelope req = make_envelope(0);
    req.mutable_status_request();
    const auto rep = c.request(req, std::chrono::seconds(2));
    return rep && rep->has_status_reply() ? int(rep->status_reply().step()) : -1;
  } catch (const std::exception&) {
    return -1;  // not started yet, or gone
  }
}

// True once the job is well into training (every rank has snapshots to restore from); asked
// at most every 200 ms (`*next`).
bool training(const std::string& job_dir, Clock::time_point* next) {
  if (Clock::now() < *next) return false;
  *next = Clock::now() + std::chrono::milliseconds(200);
  return job_step(job_dir) >= kActAtStep;
}

// The pid of the job's leader controller, as its election names it (0 if none found).
pid_t job_leader(const std::string& job_dir) {
  const auto all = events_of(job_dir);
  const events::Event* etcd = find(all, "etcd");
  if (!etcd || !etcd->data().fields().count("endpoints")) return 0;
  return leader_pid(etcd->data().fields().at("endpoints").string_value(),
                    fs::path(job_dir).filename(), job_dir);
}

pid_t parent_of(pid_t p) {
  std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');  // the name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  char state = 0;
  pid_t ppid = 0;
  rest >> state >> ppid;
  return ppid;
}

// `agent` and every process it started (workers, etcd member, controller candidate).
std::vector<pid_t> slot_processes(pid_t agent) {
  std::vector<pid_t> all = {agent};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (parent_of(pid_t(std::stoi(name))) == agent) all.push_back(pid_t(std::stoi(name)));
  }
  return all;
}

Trial controller_crash(const std::string& dir, const std::string& cfg, const std::string& sets) {
  Trial t;
  Clock::time_point next{};
  double killed_at = 0;
  const auto r = run_acting(dir, job_args(cfg, sets), [&](const std::string& job_dir) {
    if (!training(job_dir, &next)) return false;
    const pid_t leader = job_leader(job_dir);
    if (leader <= 0 || ::kill(leader, SIGKILL) != 0) return false;
    killed_at = unix_now();
    return true;
  });
  if (!r || killed_at == 0) return t;
  const auto all = events_of(job_dir_in(dir + "/runs"));
  if (const events::Event* to = find(all, "takeover")) t.detected = to->t() - killed_at;
  steps_after(*r, killed_at, &t);
  return t;
}

// The leader cut off while its machine trains on: its controller process alone stopped from
// outside (SIGSTOP: it can neither renew its lease nor command anyone, as a partitioned
// leader cannot), continued once another has taken over, when it must find itself fenced and
// step aside. `deposed`: it said so in the event log.
Trial leader_partition(const std::string& dir, const std::string& cfg, const std::string& sets,
                       bool* deposed) {
  Trial t;
  Clock::time_point next{};
  double stopped_at = 0;
  pid_t leader = 0;
  const auto r = run_acting(dir, job_args(cfg, sets), [&](const std::string& job_dir) {
    if (stopped_at == 0) {
      if (!training(job_dir, &next)) return false;
      leader = job_leader(job_dir);
      if (leader <= 0 || ::kill(leader, SIGSTOP) != 0) return false;
      stopped_at = unix_now();
      return false;
    }
    if (!find(events_of(job_dir), "takeover") && unix_now() - stopped_at < 30) return false;
    ::kill(leader, SIGCONT);
    return true;
  });
  if (leader > 0) ::kill(leader, SIGCONT);  // the job ended first
  if (!r || stopped_at == 0) return t;
  const auto all = events_of(job_dir_in(dir + "/runs"));
  if (const events::Event* to = find(all, "takeover")) t.detected = to->t() - stopped_at;
  *deposed = find(all, "deposed") != nullptr;
  steps_after(*r, stopped_at, &t);
  return t;
}

// A slot_loss fault at `rank` (step 100): its slot's processes die.
Trial slot_death(const std::string& dir, const std::string& cfg, const std::string& sets,
                 int rank) {
  Trial t;
  const auto r = run_acting(
      dir, job_args(cfg, sets) + " --fault slot_loss@step=100,rank=" + std::to_string(rank), {});
  if (!r) return t;
  for (const auto& inc : r->incidents()) {
    if (inc.injected_at() <= 0) continue;
    t.detected = inc.detected_at() - inc.injected_at();
    steps_after(*r, inc.injected_at(), &t);
    break;
  }
  return t;
}

// Slot 3's agent and everything it started stopped from outside; killed once the job has
// recovered (a machine that never comes back), so that the job can end.
Trial slot_silence(const std::string& dir, const std::string& cfg, const std::string& sets) {
  Trial t;
  Clock::time_point next{};
  double stopped_at = 0;
  std::vector<pid_t> frozen;
  const auto r = run_acting(dir, job_args(cfg, sets), [&](const std::string& job_dir) {
    if (frozen.empty()) {
      if (!training(job_dir, &next)) return false;
      const pid_t worker = worker_pid(kSwapRank);
      const pid_t agent = worker > 0 ? parent_of(worker) : 0;
      if (agent <= 1) return false;
      frozen = slot_processes(agent);
      for (pid_t p : frozen) ::kill(p, SIGSTOP);
      stopped_at = unix_now();
      return false;
    }
    if (!find(events_of(job_dir), "recovered") && unix_now() - stopped_at < 30) return false;
    for (pid_t p : frozen) ::kill(p, SIGKILL);
    return true;
  });
  for (pid_t p : frozen) ::kill(p, SIGKILL);  // the job ended before it recovered
  if (!r || stopped_at == 0) return t;
  for (const auto& inc : r->incidents()) {
    if (inc.detected_at() < stopped_at) continue;
    t.detected = inc.detected_at() - stopped_at;
    break;
  }
  steps_after(*r, stopped_at, &t);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? -1 : v[v.size() / 2];
}

double worst(const std::vector<double>& v) {
  return v.empty() ? -1 : *std::max_element(v.begin(), v.end());
}

void print_row(const std::string& kind, int trials, const std::vector<Trial>& seen) {
  std::vector<double> det, step, stall;
  for (const Trial& t : seen) {
    if (t.detected < 0) continue;
    det.push_back(t.detected);
    if (t.first_step >= 0) step.push_back(t.first_step);
    if (t.stall >= 0) stall.push_back(t.stall);
  }
  auto cell = [](double v) {
    char b[16] = "-";
    if (v >= 0) std::snprintf(b, sizeof(b), "%.3f", v);
    return std::string(b);
  };
  std::printf("%-16s %6d %6zu %10s %10s %10s %10s %10s %10s\n", kind.c_str(), trials, det.size(),
              cell(median(det)).c_str(), cell(worst(det)).c_str(), cell(median(step)).c_str(),
              cell(worst(step)).c_str(), cell(median(stall)).c_str(), cell(worst(stall)).c_str());
  std::fflush(stdout);
}

}  // namespace

const std::vector<std::string>& failover_kinds() {
  static const std::vector<std::string> k = {"controller_crash", "leader_partition", "slot0_loss",
                                             "swap_by_death", "swap_by_silence"};
  return k;
}

void failover_rows(const std::string& dir, const std::function<std::string(int)>& config,
                   const std::string& sets, const std::vector<std::string>& kinds, int trials) {
  if (kinds.empty()) return;
  std::printf(
      "\n== failover: the tiny TP2xPP2xDP2 job under keel-launch --local 5 --standby 1 (etcd "
      "members and controller candidates on slots 0-2), hot swap, one run per trial; seconds "
      "from the injection: detected (controller_crash, leader_partition: the new leader's "
      "takeover), the first step completed after it, the longest gap between two steps around "
      "it. leader_partition: the leader's process stopped (SIGSTOP) while its machine trains, "
      "continued after the takeover\n");
  std::printf("%-16s %6s %6s %10s %10s %10s %10s %10s %10s\n", "kind", "trials", "seen", "det med",
              "det worst", "step med", "step worst", "stall med", "stall worst");
  const std::string fault_cfg = config(kFaultSteps), outside_cfg = config(kOutsideSteps);
  for (const std::string& kind : failover_kinds()) {
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) continue;
    std::vector<Trial> seen;
    int deposed = 0;
    for (int k = 0; k < trials; ++k) {
      const std::string d = dir + "/" + kind + "-" + std::to_string(k);
      fs::create_directories(d);
      if (kind == "controller_crash") seen.push_back(controller_crash(d, outside_cfg, sets));
      if (kind == "leader_partition") {
        bool stepped_aside = false;
        seen.push_back(leader_partition(d, outside_cfg, sets, &stepped_aside));
        deposed += stepped_aside;
      }
      if (kind == "slot0_loss") seen.push_back(slot_death(d, fault_cfg, sets, 0));
      if (kind == "swap_by_death") seen.push_back(slot_death(d, fault_cfg, sets, kSwapRank));
      if (kind == "swap_by_silence") seen.push_back(slot_silence(d, outside_cfg, sets));
      if (seen.back().detected < 0)
        LOG(WARNING) << kind << " trial " << k << ": nothing measured (see " << d << "/run.log)";
    }
    print_row(kind, trials, seen);
    if (kind == "leader_partition")
      std::printf("%-16s the old leader, continued, stepped aside (event deposed) in %d of %d\n",
                  "", deposed, trials);
  }
}

}  // namespace keel::bench
