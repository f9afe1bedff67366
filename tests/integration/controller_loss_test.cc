// When the controller dies: a job with etcd goes on under another leader (issue 28); in a job
// without (1-2 slots), nothing of the job lingers (issue 13): the launchers that joined it by
// hand (--join) hear nothing more from it, stop their workers, remove the job's shared memory
// and exit saying why, within detect.controller_timeout_ms; and `keel-launch --resume
// runs/<job>` restarts the job from its newest persistent checkpoint.
// Also: every keel process shows in ps under its real binary and a name of its own.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launcher/exit_codes.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string k3d = "tp: 2 pp: 2 dp: 2";

std::string bin(const std::string& name) {
  return bin_dir() + "/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Polls `done` every 20 ms until it holds or `timeout` passes; whether it held.
bool wait_for(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// Exit code of a reaped status (128 + signal when killed).
int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Kills whatever is left of the sessions led by `leaders` and reaps the leaders.
void kill_sessions(const std::vector<pid_t>& leaders) {
  for (pid_t l : leaders) {
    for (pid_t p : session_processes(l)) kill(p, SIGKILL);
    int st = 0;
    waitpid(l, &st, WNOHANG);
  }
}

// The job's shared-memory segments in /dev/shm (keel-<job>-r<R>, keel-<job>-b<R>).
std::vector<std::string> job_shm(const std::string& job) {
  std::vector<std::string> out;
  const std::string prefix = "keel-" + job + "-";
  for (const auto& e : fs::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().string());
  return out;
}

void remove_all(const std::vector<std::string>& paths) {
  std::error_code ec;
  for (const auto& p : paths) fs::remove(p, ec);
}

// The only job directory under `run_dir`, "" while there is none.
std::string job_dir_in(const std::string& run_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec))
    if (e.is_directory()) return e.path().string();
  return "";
}

std::vector<std::string> cmdline(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> out;
  std::string arg;
  while (std::getline(f, arg, '\0')) out.push_back(arg);
  return out;
}

std::string comm(pid_t pid) {
  std::string s = slurp("/proc/" + std::to_string(pid) + "/comm");
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Live children of `pid` (zombies aside).
std::vector<pid_t> children(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string line = slurp(e.path().string() + "/stat");
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid && state != "Z") out.push_back(pid_t(std::stol(name)));
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// One line of `keel-ctl status`: "rank R  slot S  pid P  step N ...".
struct RankLine {
  int rank = -1, slot = -1, pid = 0;
  long long step = -1;
};

std::vector<RankLine> ctl_status(const std::string& job_dir) {
  std::vector<RankLine> out;
  FILE* p = popen((bin("keel-ctl") + " status --run " + job_dir + " 2>/dev/null").c_str(), "r");
  if (!p) return out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) {
    RankLine r;
    if (std::sscanf(buf, "rank %d slot %d pid %d step %lld", &r.rank, &r.slot, &r.pid, &r.step) ==
        4)
      out.push_back(r);
  }
  pclose(p);
  return out;
}

// --- controller loss ---

// A job's slot 0 (keel-launch --slots N) and N-1 launchers joined by hand, two workers each,
// `layout`; once every rank has trained a step, slot 0's machine dies (its process group is
// killed: launcher, controller, workers, etcd member).
struct SlotsJob {
  std::string dir, job_dir, endpoint, job;
  pid_t slot0 = -1;
  std::map<int, pid_t> joined;
  std::vector<pid_t> leaders;
  std::string logs() const {
    std::string out;
    for (const auto& [k, pid] : joined)
      out += "--- slot " + std::to_string(k) + ":\n" +
             slurp(dir + "/slot" + std::to_string(k) + ".log");
    return out;
  }
};

void start_and_lose_slot0(SlotsJob* j, const std::string& name, int slots,
                          const std::string& layout, const std::vector<std::string>& extra) {
  j->dir = temp_dir(name);
  const std::string cfg =
      write_config(j->dir, {{"parallel", layout}, {"train", "log_every: 1000"}});
  std::vector<std::string> common = {
      "--config", cfg,     "--run-dir",          j->dir + "/runs", "--workers-per-slot",
      "2",        "--set", "train.eval_every=0", "--quiet"};
  common.insert(common.end(), extra.begin(), extra.end());
  std::vector<std::string> argv0 = {bin("keel-launch"), "--slots", std::to_string(slots)};
  argv0.insert(argv0.end(), common.begin(), common.end());
  j->slot0 = start_session(argv0, j->dir + "/slot0.log");
  j->leaders = {j->slot0};
  ASSERT_TRUE(wait_for(
      [&] {
        j->job_dir = job_dir_in(j->dir + "/runs");
        std::istringstream c(j->job_dir.empty() ? "" : slurp(j->job_dir + "/controller"));
        return std::getline(c, j->endpoint) && std::getline(c, j->job) && !j->job.empty();
      },
      20s))
      << "slot 0 wrote no controller file\n"
      << slurp(j->dir + "/slot0.log");
  for (int k = 1; k < slots; ++k) {
    std::vector<std::string> argv = {bin("keel-launch"), "--join", j->endpoint, "--slot",
                                     std::to_string(k),  "--job",  j->job};
    argv.insert(argv.end(), common.begin(), common.end());
    j->joined[k] = start_session(argv, j->dir + "/slot" + std::to_string(k) + ".log");
    j->leaders.push_back(j->joined[k]);
  }
  // Every rank has trained a step, by the controller's own account.
  std::vector<RankLine> ranks;
  const bool trained = wait_for(
      [&] {
        ranks = ctl_status(j->job_dir);
        return !ranks.empty() && std::all_of(ranks.begin(), ranks.end(),
                                             [](const RankLine& r) { return r.step >= 1; });
      },
      180s);
  if (!trained) {
    kill_sessions(j->leaders);
    remove_all(job_shm(j->job));
  }
  ASSERT_TRUE(trained) << ranks.size() << " rank(s) reported\n" << slurp(j->dir + "/slot0.log");
  ASSERT_EQ(kill(-j->slot0, SIGKILL), 0);  // slot 0's machine dies
}

// What was left of a job once its joined launchers ended (or 60 s passed): their exit codes,
// how long it took, the processes and segments left, and their logs. Whatever is left is
// then killed and removed.
struct JoinedGone {
  std::map<int, int> codes;
  double took = 0;
  std::vector<pid_t> left;
  std::vector<std::string> shm;
  std::string logs;
};

JoinedGone wait_joined_gone(SlotsJob* j) {
  JoinedGone g;
  const auto t0 = Clock::now();
  wait_for(
      [&] {
        for (const auto& [k, pid] : j->joined) {
          int st = 0;
          if (!g.codes.count(k) && waitpid(pid, &st, WNOHANG) == pid) g.codes[k] = exit_code(st);
        }
        g.left.clear();
        for (pid_t l : j->leaders)
          for (pid_t p : session_processes(l))
            if (p != j->slot0) g.left.push_back(p);  // slot 0 itself: a zombie until reaped
        g.shm = job_shm(j->job);
        return g.codes.size() == j->joined.size() && g.left.empty() && g.shm.empty();
      },
      60s);  // a deadline, no measure: how soon is keel-bench's to say
  g.took = seconds_since(t0);
  int st = 0;
  waitpid(j->slot0, &st, 0);
  g.logs = j->logs();
  kill_sessions(j->leaders);
  remove_all(job_shm(j->job));
  return g;
}

// A job without etcd (2 slots: nothing to fail over to) whose slot 0 dies: the launcher that
// joined it hears nothing more, stops its workers, removes the job's shared memory and exits
// saying why, within detect.controller_timeout_ms.
TEST(ControllerLoss, JoinedSlotsStopAndRemoveTheirSharedMemory) {
  SlotsJob j;
  start_and_lose_slot0(
      &j, "controller-loss", 2, "tp: 2 pp: 2",
      {"--set", "train.steps=100000", "--set", "detect.controller_timeout_ms=3000"});
  if (HasFatalFailure()) return;
  const JoinedGone g = wait_joined_gone(&j);
  const auto& [codes, took, left, shm, logs] = g;
  EXPECT_EQ(codes.size(), 1u) << "after " << took << " s\n" << logs;
  EXPECT_TRUE(left.empty() && shm.empty())
      << left.size() << " process(es) and " << shm.size() << " segment(s) left\n"
      << logs;
  EXPECT_EQ(codes.count(1) ? codes.at(1) : -1, kExitControllerLost) << logs;
  const std::string out = slurp(j.dir + "/slot1.log");
  const std::string said = "] slot 1: no word from the controller at " + j.endpoint + " for ";
  const size_t at = out.find(said);
  ASSERT_NE(at, std::string::npos) << out;
  // Not before the controller could have been heard from: the timeout decides, as the slot
  // says (the silence it stopped on, in ms).
  EXPECT_GE(std::stol(out.substr(at + said.size())), 3000) << out;
  EXPECT_TRUE(contains(out, "removing its shared memory")) << out;
  EXPECT_TRUE(contains(out, "keel-launch --resume")) << out;
}

// Slot 0's machine dies whole, controller included, in a job with etcd (issue 28): a candidate
// beside another member takes the job over, slot 0 is a lost slot like any other (a standby
// takes its ranks, restored from memory), and the job ends every step done, bitwise equal to
// the same job without the loss, with no --resume and nothing left behind.
TEST(ControllerLoss, SlotZeroLostWholeAnotherLeaderCarriesTheJobOn) {
  const std::string ref_dir = temp_dir("controller-failover-ref");
  const std::string ref_cfg = write_config(ref_dir, {{"parallel", k3d}});
  JobRun ref = run_launch_job(ref_dir, "--config " + ref_cfg +
                                           " --local 5 --standby 1 --workers-per-slot 2 --set "
                                           "train.steps=200 --set train.eval_every=0");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  SlotsJob j;
  // Paced (5 ms a step), so that slot 0 dies well before the end. 3 etcd members, not the
  // 5 a job of 5 slots gets by default, so that a slot runs none and takes slot 0's.
  start_and_lose_slot0(
      &j, "controller-failover", 5, k3d,
      {"--standby", "1", "--set", "train.steps=200", "--fault", "slow@step=0,rank=7,delay_ms=5",
       "--set", "detect.slow_round_steps=0", "--etcd-members", "3"});
  if (HasFatalFailure()) return;
  const JoinedGone g = wait_joined_gone(&j);
  const auto& [codes, took, left, shm, logs] = g;
  ASSERT_EQ(codes.size(), 4u) << "after " << took << " s\n" << logs;
  for (const auto& [k, code] : codes) EXPECT_EQ(code, 0) << "slot " << k << "\n" << logs;
  EXPECT_TRUE(left.empty() && shm.empty())
      << left.size() << " process(es) and " << shm.size() << " segment(s) left\n"
      << logs;
  const std::string events = slurp(j.job_dir + "/events.jsonl");
  EXPECT_TRUE(contains(events, "\"takeover\"")) << events;
  // Slot 0's etcd member died with it: the new leader replaced it on slot 3 (its port
  // refused a connection, so at once: no grace for a member cut off).
  EXPECT_TRUE(contains(events, "\"removed\":\"slot0\"")) << events;
  const std::string report = slurp(j.job_dir + "/report.json");
  EXPECT_EQ(json_number_field(report, "steps_completed"), 200) << report;
  EXPECT_EQ(json_string_field(report, "param_checksum"),
            json_string_field(ref.report, "param_checksum"));
  const std::vector<std::string> inc = json_object_array(report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << report;
  EXPECT_EQ(json_string_field(inc[0], "kind"), "slot_loss") << inc[0];
  EXPECT_EQ(json_array_field(inc[0], "slots_evicted"), std::vector<double>({0})) << inc[0];
  // (On one box the dead slot's /dev/shm outlives it: its ranks' own snapshots may serve.)
  expect_restored(inc[0], {.min_step = 1,
                           .max_step = 200,
                           .from = "memory",
                           .world = 8,
                           .ranks = {{0, "backup|own_snapshot"}, {1, "backup|own_snapshot"}},
                           .others = "memory|own_snapshot"});
}

// A job killed outright (slot 0's session: no one cleans up) is restarted with
// `keel-launch --resume runs/<job>` (no --config: the run directory's is used), from its
// newest complete persistent checkpoint, and ends bit for bit where the uninterrupted job
// ends.
TEST(ControllerLoss, ResumeFromTheRunDirectoryContinuesFromTheNewestCheckpoint) {
  const std::string dir = temp_dir("controller-loss-resume");
  const std::string ck = dir + "/ck";
  const std::string cfg = write_config(dir, {{"parallel", "tp: 2 dp: 2"}});
  const std::string job_args = "--config " + cfg +
                               " --workers-per-slot 2 --set train.steps=24 --set "
                               "checkpoint.persistent_every_steps=3 --set checkpoint.dir=" +
                               ck;
  // The reference: the same job, uninterrupted.
  const JobRun ref = run_command(dir, bin("keel-launch") + " --local 2 --quiet --run-dir " + dir +
                                          "/ref-runs --report " + dir + "/report.json " + job_args +
                                          " --set checkpoint.persistent_every_steps=0");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;

  bool killed = false;
  std::string job_dir;
  const JobRun first = run_command(
      dir, bin("keel-launch") + " --local 2 --quiet --run-dir " + dir + "/runs " + job_args,
      [&](pid_t pid) {
        if (killed || !fs::exists(ck + "/step_000006/manifest.pb")) return;
        job_dir = job_dir_in(dir + "/runs");
        kill(-pid, SIGKILL);
        killed = true;
      });
  ASSERT_TRUE(killed) << first.output;
  ASSERT_FALSE(job_dir.empty());
  // The newest complete checkpoint: a step directory with its manifest.
  int newest = -1;
  for (const auto& e : fs::directory_iterator(ck))
    if (fs::exists(e.path() / "manifest.pb"))
      newest = std::max(newest, std::stoi(e.path().filename().string().substr(5)));
  ASSERT_GE(newest, 6);

  const JobRun resumed =
      run_command(dir, bin("keel-launch") + " --local 2 --quiet --workers-per-slot 2 --run-dir " +
                           dir + "/runs2 --report " + dir + "/report.json --resume " + job_dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output,
                       "keel-launch: resuming from checkpoint step " + std::to_string(newest)))
      << resumed.output;
  // Where its state came from: the newest sealed checkpoint, step `newest` (a restart from
  // step 0 would end bitwise equal too), and only the steps after it were trained.
  expect_resumed(resumed.report, newest, 24);
  EXPECT_EQ(json_string_field(resumed.report, "param_checksum"),
            json_string_field(ref.report, "param_checksum"));
  EXPECT_EQ(resumed.leftover_processes, 0) << resumed.output;
}

TEST(ControllerLoss, ResumeSaysWhatIsMissing) {
  const std::string dir = temp_dir("controller-loss-resume-errors");
  auto launch = [&](const std::string& args) {
    return run_command(dir, bin("keel-launch") + " --local 1 " + args, {}, 60);
  };
  JobRun r = launch("--resume " + dir + "/nowhere");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, dir + "/nowhere: no such directory")) << r.output;

  // A run directory whose job wrote no persistent checkpoints.
  fs::create_directories(dir + "/runs/1-00000000");
  const std::string cfg = write_config(dir);
  std::string text = slurp(cfg) + "checkpoint { dir: \"" + dir + "/no-ck\" }\n";
  std::ofstream(dir + "/runs/1-00000000/config.pbtxt") << text;
  r = launch("--resume " + dir + "/runs/1-00000000");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, dir + "/no-ck")) << r.output;
  EXPECT_TRUE(contains(r.output, "checkpoint.persistent_every_steps is 0")) << r.output;

  // A checkpoint directory without a complete checkpoint.
  fs::create_directories(dir + "/empty-ck/step_000003");
  r = launch("--config " + cfg + " --resume " + dir + "/empty-ck");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, dir + "/empty-ck: no usable checkpoint")) << r.output;
  EXPECT_TRUE(contains(r.output, "step_000003")) << r.output;
}

// --- names in ps ---

// `keel-launch --local 2 --workers-per-slot 2`: keel-launch, the job's controller (a child of
// its own, keel-controller), each slot's launcher (forked, with --join and --slot K) and each
// slot's two workers show their real binary as argv[0] and a name of their own; every worker
// is a child of its slot's launcher, and `keel-ctl status` lists each worker's PID with its
// slot.
TEST(ProcessNames, LaunchedSlotsAndWorkersShowWhatTheyAre) {
  const std::string dir = temp_dir("process-names");
  const std::string cfg = write_config(dir, {{"parallel", "tp: 2 dp: 2"}});
  const pid_t root = start_session(
      {bin("keel-launch"), "--local", "2", "--workers-per-slot", "2", "--quiet", "--config", cfg,
       "--run-dir", dir + "/runs", "--set", "train.steps=100000", "--set", "train.eval_every=0"},
      dir + "/launch.log");
  std::map<int, pid_t> agents;  // slot -> its launcher
  pid_t controller = 0;
  std::map<pid_t, int> worker_slot;  // worker pid -> the slot of its parent launcher
  const bool up = wait_for(
      [&] {
        agents.clear();
        worker_slot.clear();
        controller = 0;
        for (pid_t c : children(root)) {
          const std::vector<std::string> a = cmdline(c);
          const auto slot = std::find(a.begin(), a.end(), "--slot");
          if (std::find(a.begin(), a.end(), "--join") != a.end() && slot != a.end() &&
              slot + 1 != a.end())
            agents[std::stoi(*(slot + 1))] = c;
          else if (comm(c) == "keel-controller")
            controller = c;
        }
        for (const auto& [k, agent] : agents)
          for (pid_t c : children(agent)) {
            const std::vector<std::string> a = cmdline(c);
            if (!a.empty() && ends_with(a[0], "/keel-worker")) worker_slot[c] = k;
          }
        return controller && agents.size() == 2 && worker_slot.size() == 4;
      },
      60s);
  std::vector<RankLine> ranks;
  const std::string job_dir = job_dir_in(dir + "/runs");
  if (up)
    wait_for(
        [&] {
          ranks = ctl_status(job_dir);
          return ranks.size() == 4 && std::all_of(ranks.begin(), ranks.end(),
                                                  [](const RankLine& r) { return r.pid > 0; });
        },
        60s);
  // Read everything before the job is stopped.
  const std::vector<std::string> root_argv = cmdline(root);
  const std::string root_comm = comm(root), controller_comm = comm(controller);
  std::map<int, std::pair<std::vector<std::string>, std::string>> agent_seen;
  for (const auto& [k, pid] : agents) agent_seen[k] = {cmdline(pid), comm(pid)};
  std::map<pid_t, std::pair<std::vector<std::string>, std::string>> workers;
  for (const auto& [pid, slot] : worker_slot) workers[pid] = {cmdline(pid), comm(pid)};
  const std::string job = fs::path(job_dir).filename().string();
  kill_sessions({root});
  int st = 0;
  waitpid(root, &st, 0);
  if (!job.empty()) remove_all(job_shm(job));

  ASSERT_TRUE(up) << agents.size() << " slot launcher(s), controller " << controller << ", "
                  << worker_slot.size() << " worker(s)\n"
                  << slurp(dir + "/launch.log");
  ASSERT_FALSE(root_argv.empty());
  EXPECT_EQ(root_argv[0], bin("keel-launch"));
  EXPECT_EQ(root_comm, "keel-launch");
  EXPECT_EQ(controller_comm, "keel-controller");
  for (const auto& [k, a] : agent_seen) {
    ASSERT_FALSE(a.first.empty());
    EXPECT_TRUE(ends_with(a.first[0], "/keel-launch")) << a.first[0];
    EXPECT_EQ(fs::canonical(a.first[0]), fs::canonical(bin("keel-launch")));
    EXPECT_EQ(a.second, "keel-agent") << "slot " << k;
  }
  for (const auto& [pid, w] : workers) {
    ASSERT_FALSE(w.first.empty());
    EXPECT_TRUE(ends_with(w.first[0], "/keel-worker")) << pid << ": " << w.first[0];
    EXPECT_EQ(w.second, "keel-worker") << pid;
  }
  ASSERT_EQ(ranks.size(), 4u) << "keel-ctl status listed " << ranks.size() << " rank(s)";
  for (const RankLine& r : ranks) {
    ASSERT_TRUE(worker_slot.count(r.pid))
        << "rank " << r.rank << ": pid " << r.pid << " is no worker of the job";
    EXPECT_EQ(worker_slot[r.pid], r.slot) << "rank " << r.rank;
  }
}

// `keel-worker --nproc 2`: the supervisor and its ranks, the same way.
TEST(ProcessNames, NprocSupervisorAndRanksShowWhatTheyAre) {
  const std::string dir = temp_dir("process-names-nproc");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 2"}});
  const pid_t root = start_session({bin("keel-worker"), "--nproc", "2", "--quiet", "--config", cfg,
                                    "--set", "train.steps=100000", "--set", "train.eval_every=0"},
                                   dir + "/nproc.log");
  std::vector<pid_t> ranks;
  // Two ranks, each past its exec (a forked child shows its parent's command line first).
  const bool up = wait_for(
      [&] {
        ranks = children(root);
        return ranks.size() == 2 && std::all_of(ranks.begin(), ranks.end(), [](pid_t p) {
                 // An empty command line is a process between fork and exec (or in one):
                 // not yet what it will be.
                 const std::vector<std::string> a = cmdline(p);
                 return !a.empty() && std::find(a.begin(), a.end(), "--nproc") == a.end();
               });
      },
      30s);
  const std::string root_comm = comm(root);
  std::vector<std::pair<std::vector<std::string>, std::string>> seen;
  for (pid_t p : ranks) seen.push_back({cmdline(p), comm(p)});
  const std::string job_prefix = "/dev/shm/keel-" + std::to_string(root) + "-";
  kill_sessions({root});
  int st = 0;
  waitpid(root, &st, 0);
  for (const auto& e : fs::directory_iterator("/dev/shm"))
    if (e.path().string().rfind(job_prefix, 0) == 0) fs::remove(e.path());

  ASSERT_TRUE(up) << slurp(dir + "/nproc.log");
  EXPECT_EQ(root_comm, "keel-supervisor");
  for (const auto& [argv, name] : seen) {
    ASSERT_FALSE(argv.empty());
    EXPECT_EQ(fs::canonical(argv[0]), fs::canonical(bin("keel-worker"))) << argv[0];
    EXPECT_EQ(name, "keel-worker");
  }
}

}  // namespace
}  // namespace keel::test
