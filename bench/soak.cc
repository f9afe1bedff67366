#include "bench/soak.h"

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "bench/bench_report.h"
#include "bench/bench_util.h"
#include "bench/job_in_etcd.h"
#include "bench/process_watch.h"
#include "bench/soak_cluster.h"
#include "bench/soak_svg.h"
#include "integration/netns.h"
#include "proto/bench.pb.h"
#include "proto/config_loader.h"
#include "runtime/check.h"
#include "runtime/text.h"

namespace keel::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The exit status of a finished child, or -1 while it runs.
int reap(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, WNOHANG) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// The fault mix: crashes twice as often as the rest (the commonest failure there is);
// partitions only where a slot has a link of its own to cut.
std::vector<faults::Fault::Kind> mix(bool partitions) {
  using F = faults::Fault;
  std::vector<F::Kind> k = {F::crash,         F::crash,    F::exit,
                            F::hang,          F::freeze,   F::hang_in_collective,
                            F::spin,          F::nan,      F::corrupt_snapshot,
                            F::lose_snapshot, F::slot_loss};
  if (partitions) k.push_back(F::partition);
  return k;
}

// Reads the new lines of a growing events.jsonl, one Event per complete line.
class EventTail {
 public:
  std::vector<events::Event> read(const std::string& path) {
    std::ifstream in(path);
    in.seekg(offset_);
    std::vector<events::Event> out;
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a line still being written: read it whole next time
      offset_ += line.size() + 1;
      events::Event e;
      if (parse_event(line, &e)) out.push_back(std::move(e));
    }
    return out;
  }

 private:
  std::streamoff offset_ = 0;
};

int64_t median(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// A long-lived process is flat when its late median resident memory exceeds its early one by
// no more than 8 MiB + 5%: allocator arenas and the controller's incident history may settle
// a little, and a standby parked since the start and promoted in the middle takes a rank's
// state and buffers once (4 MiB for the tiny 3-D job: a worker went from 5 to 9 MiB); a leak
// per fault grows without bound and, over a few hundred faults, past this.
constexpr int64_t kFlatSlackBytes = 8 << 20;
constexpr double kFlatSlackShare = 0.05;

void memory_verdict(const ProcessWatch& watch, double wall_s, SoakReport* rep) {
  for (const auto& [key, p] : watch.seen()) {
    const pid_t pid = key.first;
    if (p.samples.empty()) continue;
    const double first = p.samples.front().t, last = p.samples.back().t, life = last - first;
    // Long-lived: through half the run at least. Not from its start to its end: when the
    // soak loses every machine in turn and kills leaders, no process lives that long, and a
    // leak per fault still shows in one that lives through half of them. The windows are of
    // the process's own life (for one alive throughout, the run's quarters).
    if (life < 0.5 * wall_s) continue;
    std::vector<int64_t> early, late;
    for (const auto& s : p.samples) {
      if (s.t >= first + 0.25 * life && s.t < first + 0.5 * life) early.push_back(s.rss);
      if (s.t >= first + 0.75 * life) late.push_back(s.rss);
    }
    if (early.empty() || late.empty()) continue;
    auto* m = rep->add_processes();
    m->set_pid(pid);
    m->set_name(p.name);
    m->set_first_seen_s(first);
    m->set_last_seen_s(last);
    m->set_early_rss_bytes(median(early));
    m->set_late_rss_bytes(median(late));
    m->set_growth_bytes(m->late_rss_bytes() - m->early_rss_bytes());
    m->set_flat(m->growth_bytes() <=
                kFlatSlackBytes + int64_t(kFlatSlackShare * double(m->early_rss_bytes())));
    m->set_judged(p.name != "etcd");
    if (m->judged() && !m->flat())
      rep->add_failures("memory: " + p.name + " (" + std::to_string(pid) + ") grew from " +
                        std::to_string(m->early_rss_bytes() >> 20) + " to " +
                        std::to_string(m->late_rss_bytes() >> 20) + " MiB");
  }
}

struct RunResult {
  int exit_code = -1;
  double wall_s = 0;
  report::RunReport report;
  std::string job;
  // The faults the ranks injected, as the job's store counted them when last read: in the
  // job's own etcd, which goes with the job, it is read while the job runs.
  std::optional<int64_t> fired;
};

// How often a running job's count of injected faults is read.
constexpr double kFiredReadEvery_s = 2;

// One keel-launch run in `dir` on `cluster` (`args` includes --set for each of `sets`, which
// joiners repeat), watched until it ends or `timeout_s` passes. In namespaces every slot but
// 0 joins from its machine at the start. While it runs, every slot the job loses is repaired
// and started again with --join (retried while the controller still refuses it), and, with
// `watch`, the job's processes are sampled once a second.
RunResult run_job(const SoakOptions& o, SoakCluster& cluster, const std::vector<std::string>& args,
                  const std::vector<std::string>& sets, const std::string& dir, double timeout_s,
                  ProcessWatch* watch, const std::string& tag, int total_faults, SoakReport* rep) {
  fs::remove_all(dir);
  fs::create_directories(dir + "/runs");
  std::vector<std::string> a = args;
  a.insert(a.end(), {"--quiet", "--run-dir", dir + "/runs", "--report", dir + "/report.json"});
  const auto t0 = Clock::now();
  const pid_t main_pid = cluster.start(0, a, tag, dir + "/launch.log");
  RunResult res;
  EventTail events;
  std::string job_dir, endpoint;
  struct Join {
    pid_t pid = -1;  // its --join launcher, while it runs
    Clock::time_point retry_at, started;
    bool rejoin = true;      // after a loss (not a machine's first join): counted in rejoins
    bool as_rejoin = false;  // the launcher now running was counted as one
    bool counted = false;    // it stayed up: the slot is back
    bool done = false;       // it ended with the job
    int starts = 0;
  };
  std::map<int, Join> joins;  // every slot that joins: in namespaces all, else the lost ones
  if (cluster.netns())
    for (int slot = 1; slot < cluster.slots(); ++slot) joins[slot].rejoin = false;
  std::vector<pid_t> joined_pids;
  int recovered = 0, restored_step = 0;
  double next_sample = 0, next_line = 5, next_kill = o.kill_controller_every_s, next_fired = 0;
  // The job's etcd: the soak's own cluster, or the members the job started (its `etcd`
  // event), and each member it added since (`etcd_member`): a client tries every one.
  std::vector<std::string> etcd = split(cluster.etcd_endpoints(), ',', /*skip_empty=*/true);
  std::optional<int> ended;  // the job's end as its `end` event says it
  // In namespaces slot 0's launcher is a slot like any other: killed with its machine (ranks
  // move, and a lost slot's fault may name one it hosts now), the job goes on, slot 0 rejoins
  // as a lost slot does, and the job's end comes from etcd.
  bool main_gone = false;
  double next_end_look = 0;
  while (true) {
    if (!main_gone) {
      const int rc = reap(main_pid);
      if (rc >= 0 && !(cluster.netns() && rc > 128)) {
        res.exit_code = rc;
        break;
      }
      main_gone = rc >= 0;
    } else if (ended) {
      res.exit_code = *ended;
      break;
    } else if (since(t0) >= next_end_look) {
      next_end_look = since(t0) + 0.5;
      if (const auto end = job_end_code(join(etcd, ','), res.job, job_dir)) {
        res.exit_code = *end;
        break;
      }
    }
    if (since(t0) > timeout_s) {
      std::fprintf(stderr, "keel-bench soak: the run did not end within %.0f s; killing it\n",
                   timeout_s);
      kill(-main_pid, SIGKILL);
      for (pid_t p : joined_pids) kill(-p, SIGKILL);
      waitpid(main_pid, nullptr, 0);
      res.exit_code = 124;
      break;
    }
    if (job_dir.empty()) job_dir = job_dir_in(dir + "/runs");
    // The controller file names the leader now: a new one rewrites it when it takes over.
    if (!job_dir.empty()) {
      std::string now_at, job;
      if (read_controller_file(job_dir, &now_at, &job)) {
        endpoint = now_at;
        res.job = job;
      }
    }
    if (!job_dir.empty()) {
      for (const events::Event& e : events.read(job_dir + "/events.jsonl")) {
        if (e.kind() == "slot_lost") {
          // The machine is repaired first: a partitioned one still runs its launcher, cut
          // off, which must not be taken for a slot that is back.
          const int slot = int(event_number(e, "slot"));
          cluster.repair(slot);
          Join& j = joins[slot];
          j.retry_at = Clock::now();
          j.done = false;
          j.rejoin = true;
        } else if (e.kind() == "etcd" && cluster.etcd_endpoints().empty()) {
          etcd = split(event_string(e, "endpoints"), ',', /*skip_empty=*/true);
        } else if (e.kind() == "etcd_member" && !event_string(e, "endpoint").empty()) {
          etcd.push_back(event_string(e, "endpoint"));
        } else if (e.kind() == "end") {
          ended = int(event_number(e, "code"));
        } else if (e.kind() == "takeover") {
          rep->set_takeovers(rep->takeovers() + (total_faults > 0));
        } else if (e.kind() == "recovered") {
          ++recovered;
          restored_step = std::max(restored_step, int(event_number(e, "restored_step")));
        }
      }
    }
    // A lost slot comes back as its machine would after a repair: its launcher joins again.
    // The controller refuses a join until it has let the slot go; then the joiner exits
    // non-zero and is started again shortly. A joiner up for 5 s has joined: should it die
    // later, its slot was lost again, and it is not taken back from the count.
    for (auto& [slot, j] : joins) {
      if (j.pid > 0) {
        const int rc = reap(j.pid);
        if (rc < 0) {  // up: joined, or still asking
          if (Clock::now() - j.started > std::chrono::seconds(5)) j.counted = true;
          continue;
        }
        j.pid = -1;
        if (rc == 0) {  // ended with the job
          j.done = true;
          continue;
        }
        j.retry_at = Clock::now() + std::chrono::milliseconds(300);
        if (j.as_rejoin && !j.counted) rep->set_rejoins(rep->rejoins() - 1);  // refused
      }
      if (j.done || endpoint.empty() || Clock::now() < j.retry_at) continue;
      std::vector<std::string> a = {"--join",
                                    endpoint,
                                    "--slot",
                                    std::to_string(slot),
                                    "--job",
                                    res.job,
                                    "--config",
                                    o.config,
                                    "--workers-per-slot",
                                    std::to_string(o.workers_per_slot),
                                    "--run-dir",
                                    dir + "/runs",
                                    "--quiet"};
      for (const std::string& s : sets) a.insert(a.end(), {"--set", s});
      j.pid = cluster.start(
          slot, a, tag,
          dir + "/join-slot" + std::to_string(slot) + "-" + std::to_string(++j.starts) + ".log");
      j.started = Clock::now();
      j.counted = false;
      j.as_rejoin = j.rejoin;
      joined_pids.push_back(j.pid);
      if (j.rejoin) rep->set_rejoins(rep->rejoins() + 1);
    }
    const double t = since(t0);
    // The leader controller killed -9 from outside, as an OOM kill or a bug would, once the
    // previous kill was taken over: the job must outlive any number of them.
    if (total_faults > 0 && o.kill_controller_every_s > 0 && !res.job.empty() && t >= next_kill &&
        rep->takeovers() >= rep->controller_kills()) {
      next_kill = t + o.kill_controller_every_s;
      const pid_t leader = leader_pid(join(etcd, ','), res.job, job_dir);
      const std::string name = read_text("/proc/" + std::to_string(leader) + "/comm");
      if (leader > 0 && kill(leader, SIGKILL) == 0) {
        rep->set_controller_kills(rep->controller_kills() + 1);
        LOG(INFO) << "soak: killed the leader controller, pid " << leader << " ("
                  << name.substr(0, name.find('\n')) << ")";
      }
    }
    if (total_faults > 0 && !res.job.empty() && !etcd.empty() && t >= next_fired) {
      next_fired = t + kFiredReadEvery_s;
      if (const auto n = faults_fired(join(etcd, ','), res.job, job_dir))
        res.fired = std::max(res.fired.value_or(0), *n);
    }
    if (watch && t >= next_sample) {
      watch->sample();
      next_sample = t + 1;
    }
    if (total_faults > 0 && t >= next_line) {
      std::printf(
          "keel-bench soak: %5.0f s | restored step %d | %d/%d faults recovered | %d "
          "rejoins | controller killed %d, taken over %d\n",
          t, restored_step, recovered, total_faults, rep->rejoins(), rep->controller_kills(),
          rep->takeovers());
      std::fflush(stdout);
      next_line = t + 10;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  res.wall_s = since(t0);
  // The joined launchers end with the job (the controller tells them); wait for them.
  for (pid_t p : joined_pids) {
    const auto d = Clock::now() + std::chrono::seconds(20);
    while (reap(p) < 0 && kill(p, 0) == 0 && Clock::now() < d)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Read once more where the etcd outlives the job (the soak's own cluster).
  if (total_faults > 0 && !res.job.empty() && !etcd.empty())
    if (const auto n = faults_fired(join(etcd, ','), res.job, job_dir))
      res.fired = std::max(res.fired.value_or(0), *n);
  read_report(dir + "/report.json", &res.report);
  return res;
}

}  // namespace

faults::FaultSchedule soak_schedule(int faults, int64_t first_step, int gap, int world,
                                    uint64_t seed, bool partitions) {
  std::mt19937_64 gen(seed);
  const std::vector<faults::Fault::Kind> kinds = mix(partitions);
  std::vector<faults::Fault::Kind> deck;
  faults::FaultSchedule s;
  for (int i = 0; i < faults; ++i) {
    if (deck.empty()) {  // one whole mix per round, in a drawn order
      deck = kinds;
      for (size_t k = deck.size() - 1; k > 0; --k) std::swap(deck[k], deck[gen() % (k + 1)]);
    }
    faults::Fault* f = s.add_fault();
    f->set_kind(deck.back());
    deck.pop_back();
    f->set_step(first_step + int64_t(i) * gap);
    // Any rank, slot 0's too: its machine is lost like any other (its launcher, the first
    // controller, an etcd-less slot's agent), and the job goes on (run_job).
    f->set_rank(int(gen() % uint64_t(world)));
  }
  return s;
}

int soak_main(const SoakOptions& given) {
  SoakOptions o = given;
  fs::create_directories(o.out);
  o.out = fs::canonical(o.out).string();
  const config::JobConfig cfg = load_config(o.config, o.sets);
  const int world = cfg.parallel().tp() * cfg.parallel().pp() * cfg.parallel().dp();
  if (o.faults < 1 || o.gap_steps < 2 || world % o.workers_per_slot != 0 ||
      world / o.workers_per_slot < 2 || o.standby < 1) {
    std::fprintf(stderr,
                 "keel-bench soak: needs --soak >= 1, a world (%d) of at least two slots of "
                 "--workers-per-slot (%d), and --standby >= 1\n",
                 world, o.workers_per_slot);
    return 2;
  }
  if (o.local == 0) o.local = world / o.workers_per_slot + o.standby;
  // Partitions need a link per slot: network namespaces, where they can be made.
  std::string why_local;
  bool netns = o.machines == SoakMachines::kNetns;
  if (o.machines == SoakMachines::kAuto) {
    netns = test::NetnsLab::available(&why_local);
  } else if (netns && !test::NetnsLab::available(&why_local)) {
    std::fprintf(stderr, "keel-bench soak: --soak-machines netns: %s\n", why_local.c_str());
    return 2;
  } else if (!netns) {
    why_local = "--soak-machines local";
  }
  std::unique_ptr<SoakCluster> cluster;
  try {
    cluster = std::make_unique<SoakCluster>(netns, o.local, o.own_etcd);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-bench soak: cannot build the machines: %s\n", e.what());
    return 1;
  }
  const int64_t first = 10;
  const int64_t steps = first + int64_t(o.faults) * o.gap_steps + 10;

  SoakReport rep;
  rep.set_config(o.config);
  rep.set_faults(o.faults);
  rep.set_steps(int(steps));
  rep.set_machines(netns ? "netns" : "local");
  rep.set_etcd(o.own_etcd ? "own" : "job");
  if (!netns) rep.set_no_partitions_why(why_local);
  *rep.mutable_schedule() = soak_schedule(o.faults, first, o.gap_steps, world, o.seed, netns);
  for (const auto& f : rep.schedule().fault())
    ++(*rep.mutable_faults_by_kind())[faults::Fault::Kind_Name(f.kind())];
  std::string text;
  google::protobuf::TextFormat::PrintToString(rep.schedule(), &text);
  const std::string sched = o.out + "/soak-schedule.pbtxt";
  write_file(sched, "# keel-bench --soak " + std::to_string(o.faults) + " --seed " +
                        std::to_string(o.seed) + ": the faults, to repeat with --inject\n" + text);

  // Both runs: the same layout, steps and overrides. Every fault is an incident, so the
  // incident cap goes; a standby still on its way back is waited for, not a reason to stop.
  std::vector<std::string> args = cluster->layout_args();
  args.insert(args.end(), {"--config", o.config, "--standby", std::to_string(o.standby),
                           "--workers-per-slot", std::to_string(o.workers_per_slot)});
  std::vector<std::string> sets = o.sets;
  sets.insert(sets.end(), {"train.steps=" + std::to_string(steps),
                           "recovery.max_incidents=" + std::to_string(2 * o.faults + 10),
                           "recovery.on_no_standby=wait"});
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  for (const std::string& s : sets) rep.add_sets(s);

  const std::string tag =
      "KEEL_SOAK_TAG=" + std::to_string(getpid()) + "-" +
      std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  std::printf(
      "keel-bench soak: %d faults over %lld steps, world %d on %d slots (%d standby), %s; etcd "
      "%s\n",
      o.faults, static_cast<long long>(steps), world, o.local, o.standby,
      netns ? "one network namespace each"
            : ("all on this machine (no partitions: " + why_local + ")").c_str(),
      o.own_etcd ? "a cluster of its own on the host (--soak-etcd own)"
                 : "on the job's own slots, lost and replaced with them");
  std::printf("keel-bench soak: the fault-free reference ...\n");
  std::fflush(stdout);
  const RunResult ref = run_job(o, *cluster, args, sets, o.out + "/reference",
                                60 + 0.5 * double(steps), nullptr, tag + "-ref", 0, &rep);
  rep.set_reference_checksum(ref.report.param_checksum());
  rep.set_reference_wall_s(ref.wall_s);
  if (ref.exit_code != 0) {
    std::fprintf(stderr, "keel-bench soak: the reference run failed (exit %d; see %s)\n",
                 ref.exit_code, (o.out + "/reference/launch.log").c_str());
    return 1;
  }

  std::printf("keel-bench soak: the job under %d faults (%s) ...\n", o.faults, sched.c_str());
  std::fflush(stdout);
  ProcessWatch watch(tag);
  std::vector<std::string> soak_args = args;
  soak_args.insert(soak_args.end(), {"--inject", sched});
  // Budget: the reference's time plus 30 s a fault; a soak that needs more is stuck.
  const RunResult run =
      run_job(o, *cluster, soak_args, sets, o.out + "/soak", 120 + 3 * ref.wall_s + 30.0 * o.faults,
              &watch, tag, o.faults, &rep);
  const report::RunReport& r = run.report;
  rep.set_exit_code(run.exit_code);
  rep.set_soak_wall_s(run.wall_s);
  rep.set_steps_completed(r.steps_completed());
  rep.set_incidents(r.incidents_size());
  rep.set_soak_checksum(r.param_checksum());
  rep.set_bitwise_equal(!r.param_checksum().empty() &&
                        r.param_checksum() == ref.report.param_checksum());
  rep.set_ettr(r.ettr());

  // Leftovers: give the job's processes a few seconds to finish exiting, then look.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!watch.alive().empty() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (const std::string& p : watch.alive()) rep.add_leftover_processes(p);
  for (const std::string& s : cluster->leftover_shm(run.job)) rep.add_leftover_shm(s);
  memory_verdict(watch, run.wall_s, &rep);

  if (run.exit_code != 0)
    rep.add_failures("the job exited with status " + std::to_string(run.exit_code) + " (see " +
                     o.out + "/soak/launch.log)");
  if (r.steps_completed() != steps)
    rep.add_failures("steps: " + std::to_string(r.steps_completed()) + " of " +
                     std::to_string(steps) + " done");
  if (!rep.bitwise_equal())
    rep.add_failures("parameters: " + r.param_checksum() + " vs the reference's " +
                     ref.report.param_checksum());
  // Every step's record reached the report, and each loss is the one the fault-free run
  // computed at that step (the runs are bitwise equal): nothing lost, nothing invented.
  rep.set_steps_without_record(r.steps_without_record_size());
  if (r.steps_without_record_size() > 0)
    rep.add_failures(
        std::to_string(r.steps_without_record_size()) + " step(s) without record, the first " +
        std::to_string(r.steps_without_record(0) + 1) + ": " + r.steps_without_record_why());
  int first_wrong = -1;
  for (int i = 0; i < r.losses_size(); ++i) {
    const bool same = i < ref.report.losses_size() && r.losses(i) == ref.report.losses(i);
    if (same || std::isnan(r.losses(i))) continue;  // a gap is counted above
    rep.set_losses_not_the_references(rep.losses_not_the_references() + 1);
    if (first_wrong < 0) first_wrong = i;
  }
  // Said, not yet a failure: once in three in-job runs the last ~27 steps' losses differed
  // from the reference's, a rolled-back attempt's records shown for the rerun's (fixed since:
  // records carry their epoch, launcher/job_history.cc); a failure once runs confirm it.
  if (first_wrong >= 0)
    std::printf(
        "keel-bench soak: %d loss(es) differ from the fault-free run's, the first at "
        "step %lld\n",
        rep.losses_not_the_references(), static_cast<long long>(r.first_step() + first_wrong + 1));
  if (rep.takeovers() < rep.controller_kills())
    rep.add_failures("the leader controller was killed " + std::to_string(rep.controller_kills()) +
                     " times and taken over " + std::to_string(rep.takeovers()) + " times");
  // One incident at least for each fault that fired: a fault of a step that a recovery
  // restored past (the step in flight when another fault struck) never fires, and the
  // injection records, not the schedule, say which did.
  const std::optional<int64_t> fired = run.fired;
  if (fired) std::printf("keel-bench soak: %lld of %d faults fired\n", (long long)*fired, o.faults);
  if (r.incidents_size() < fired.value_or(o.faults))
    rep.add_failures("incidents: " + std::to_string(r.incidents_size()) + " for " +
                     std::to_string(fired.value_or(o.faults)) + " faults fired (" +
                     std::to_string(o.faults) + " scheduled)");
  // Where the state came from: every restore from memory (a survivor, the rank's own
  // snapshot or its backup on another slot) at the step in flight or the one before; a
  // restore from disk or from step 0 would end bitwise equal too, and is a failure here.
  for (const auto& inc : r.incidents()) {
    for (const auto& [rank, source] : inc.rank_sources()) ++(*rep.mutable_rank_sources())[source];
    rep.set_steps_lost(rep.steps_lost() + inc.steps_lost());
    if (inc.kind() == "nan") continue;  // nothing restored: the update is skipped
    if (inc.restored_from() != "memory" || inc.restored_step() < inc.step() - 1)
      rep.add_failures("incident at step " + std::to_string(inc.step()) + " (" + inc.kind() +
                       ") restored step " + std::to_string(inc.restored_step()) + " from '" +
                       inc.restored_from() + "'");
  }
  for (const std::string& p : rep.leftover_processes()) rep.add_failures("left running: " + p);
  for (const std::string& s : rep.leftover_shm()) rep.add_failures("left in /dev/shm: " + s);
  if (rep.processes_size() == 0) rep.add_failures("memory: no process lived long enough to judge");

  google::protobuf::util::JsonPrintOptions jo;
  jo.add_whitespace = true;
  jo.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(rep, &json, jo);
  write_file(o.out + "/soak.json", json);
  write_file(o.out + "/soak-rss.svg", soak_rss_svg(watch, run.wall_s));

  std::printf("\nkeel-bench soak: %d faults (", o.faults);
  bool comma = false;
  for (const auto& [k, n] : rep.faults_by_kind()) {
    std::printf("%s%s %d", comma ? ", " : "", k.c_str(), n);
    comma = true;
  }
  std::printf(
      ")\n  steps %d/%lld, incidents %d, rejoins %d, controller killed %d and taken over %d, "
      "wall %.0f s (reference %.0f s), ETTR %.1f%%\n",
      r.steps_completed(), static_cast<long long>(steps), r.incidents_size(), rep.rejoins(),
      rep.controller_kills(), rep.takeovers(), run.wall_s, ref.wall_s, 100 * r.ettr());
  std::printf("  parameters %s (%s); restored ranks from",
              rep.bitwise_equal() ? "bitwise equal" : "DIFFER", r.param_checksum().c_str());
  for (const auto& [source, n] : rep.rank_sources()) std::printf(" %s %d", source.c_str(), n);
  std::printf("; steps redone %d\n", rep.steps_lost());
  for (const auto& m : rep.processes())
    std::printf("  %-12s pid %-7d rss %5.1f -> %5.1f MiB %s\n", m.name().c_str(), m.pid(),
                m.early_rss_bytes() / 1048576.0, m.late_rss_bytes() / 1048576.0,
                !m.judged() ? (m.flat() ? "flat (not judged: its Raft log)"
                                        : "grew (not judged: its Raft log fills up)")
                : m.flat()  ? "flat"
                            : "GREW");
  std::printf("  leftover processes %d, shared memory %d\n", rep.leftover_processes_size(),
              rep.leftover_shm_size());
  for (const std::string& f : rep.failures()) std::printf("  FAILED: %s\n", f.c_str());
  std::printf("keel-bench soak: %s (%s/soak.json, soak-rss.svg)\n",
              rep.failures_size() ? "FAILED" : "passed", o.out.c_str());
  return rep.failures_size() ? 1 : 0;
}

}  // namespace keel::bench
