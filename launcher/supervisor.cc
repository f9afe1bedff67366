#include "launcher/supervisor.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "ckpt/backup_placement.h"
#include "ckpt/persistent_checkpoint.h"
#include "ckpt/restore.h"
#include "ckpt/snapshot_region.h"
#include "launcher/recovery_protocol.h"
#include "parallel/tcp_store.h"
#include "proto/config_loader.h"
#include "proto/report.pb.h"
#include "runtime/check.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;
using recovery::unix_now;

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  g_signal = sig;
}

struct Exit {
  int rank = -1;
  int status = 0;
  bool clean() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  bool fatal() const {
    return WIFEXITED(status) && (WEXITSTATUS(status) == recovery::kExitInputError ||
                                 WEXITSTATUS(status) == recovery::kExitNonFinite);
  }
  int code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
  std::string describe() const {
    if (WIFSIGNALED(status))
      return detail::concat("killed by signal ", WTERMSIG(status), " (",
                            strsignal(WTERMSIG(status)), ")");
    return detail::concat("exited with status ", WEXITSTATUS(status));
  }
};

// Segments of supervisors that died without cleaning up (SIGKILL, a power cut): their job
// id starts with the supervisor's PID, and a PID with no process is a job that is over.
void remove_stale_segments() {
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return;
  std::set<std::string> stale;
  while (dirent* e = ::readdir(dir)) {
    int pid = 0;
    unsigned tag = 0;
    char kind = 0;
    if (std::sscanf(e->d_name, "keel-%d-%8x-%c", &pid, &tag, &kind) == 3 && pid > 0 &&
        ::kill(pid, 0) != 0 && errno == ESRCH) {
      char job[32];
      std::snprintf(job, sizeof(job), "%d-%08x", pid, tag);
      stale.insert(job);
    }
  }
  ::closedir(dir);
  for (const auto& job : stale) {
    const int n = unlink_job_segments(job);
    if (n > 0)
      std::fprintf(stderr, "keel-worker: removed %d shared-memory segment(s) of ended job %s\n", n,
                   job.c_str());
  }
}

std::string make_job_id() {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%d-%08x", int(getpid()), unsigned(rd()));
  return buf;
}

class Supervisor {
 public:
  Supervisor(const WorkerOptions& o, std::vector<std::string> argv)
      : argv_(std::move(argv)),
        nproc_(o.nproc),
        cfg_(load_config(o.config_path, o.overrides)),
        topo_(cfg_.parallel().tp(), cfg_.parallel().pp(), cfg_.parallel().dp()),
        job_(make_job_id()),
        job_start_(unix_now()),
        pids_(size_t(o.nproc), -1) {}

  int run() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM}) KEEL_CHECK_ERRNO(sigaction(sig, &sa, nullptr));
    remove_stale_segments();
    server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
    addr_ = "127.0.0.1:" + std::to_string(server_->port());
    store_ = std::make_shared<TcpStore>("127.0.0.1", server_->port());
    std::fflush(nullptr);
    for (int r = 0; r < nproc_; ++r) spawn(r, /*restarted=*/false);
    const int code = supervise();
    stop_all(SIGKILL, std::chrono::seconds(0));
    const int removed = unlink_job_segments(job_);
    (void)removed;
    return code;
  }

 private:
  int supervise() {
    auto next_error_poll = Clock::now();
    int finished = 0;
    while (true) {
      if (g_signal) {
        std::fprintf(stderr, "keel-worker: %s: stopping every rank\n", strsignal(g_signal));
        stop_all(SIGTERM, std::chrono::seconds(5));
        return 128 + g_signal;
      }
      Exit ex;
      if (poll_exit(&ex)) {
        if (ex.clean()) {
          if (++finished == nproc_) return 0;
          continue;
        }
        if (finished > 0 || ex.fatal() || !recovers()) return stop_job(ex);
        if (!incident(ex.rank, ex.describe(), ex)) return stop_job(ex);
        continue;
      }
      if (Clock::now() >= next_error_poll) {
        next_error_poll = Clock::now() + std::chrono::milliseconds(20);
        if (store_->add(recovery::errors_key(epoch_), 0) > 0 && recovers()) {
          if (!incident(-1, "a communication error", Exit{})) return 1;
          continue;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  bool recovers() const { return nproc_ > 1; }

  // A rank failed (culprit >= 0, its exit in `ex`) or reported a CommError (culprit -1).
  // Returns false when the job must stop.
  bool incident(int culprit, const std::string& what, const Exit& ex) {
    report::Incident inc;
    inc.set_detected_at(unix_now());
    inc.set_rank(culprit);
    inc.set_kind(culprit >= 0 ? (WIFSIGNALED(ex.status) ? "crash" : "exit") : "comm_error");
    inc.set_detail(culprit >= 0 ? detail::concat("rank ", culprit, " ", what) : what);
    if (++incidents_ > cfg_.recovery().max_incidents()) {
      std::fprintf(stderr,
                   "keel-worker: %d incidents, more than recovery.max_incidents = %d; stopping the "
                   "job (last: %s)\n",
                   incidents_, cfg_.recovery().max_incidents(), inc.detail().c_str());
      return false;
    }
    if (cfg_.recovery().mode() == config::RecoveryConfig::restart_all)
      restart_all(&inc);
    else
      restart_in_place(culprit, &inc);
    const int64_t n = store_->add(recovery::kIncidentCount, 1) - 1;
    store_->set(recovery::incident_key(n), inc.SerializeAsString());
    std::fprintf(
        stderr, "keel-worker: incident %lld: %s at step %lld; %s (epoch %d, restored step %lld)\n",
        static_cast<long long>(n + 1), inc.detail().c_str(), static_cast<long long>(inc.step() + 1),
        inc.action().c_str(), epoch_, static_cast<long long>(inc.restored_step()));
    return true;
  }

  void restart_in_place(int culprit, report::Incident* inc) {
    const int next = epoch_ + 1;
    store_->set(recovery::abort_key(next), inc->detail());
    std::set<int> restart;
    if (culprit >= 0) restart.insert(culprit);
    // Every other rank aborts its communicators and acknowledges; one that does not within
    // recovery.abort_timeout_ms is hung (its own thread cannot be interrupted) and is killed.
    std::map<int, std::pair<int64_t, int64_t>> acks;  // rank -> (steps completed, in flight)
    const auto deadline =
        Clock::now() + std::chrono::milliseconds(cfg_.recovery().abort_timeout_ms());
    while (true) {
      Exit ex;
      while (poll_exit(&ex)) {
        restart.insert(ex.rank);
        inc->set_detail(inc->detail() + detail::concat("; rank ", ex.rank, " ", ex.describe()));
      }
      bool all = true;
      for (int r = 0; r < nproc_; ++r) {
        if (restart.count(r) || acks.count(r)) continue;
        try {
          std::string v = store_->get(recovery::ack_key(next, r), std::chrono::milliseconds(1));
          long long done = 0, in_flight = 0;
          std::sscanf(v.c_str(), "%lld %lld", &done, &in_flight);
          acks[r] = {done, in_flight};
        } catch (const CommTimeout&) {
          all = false;
        }
      }
      if (all) break;
      if (Clock::now() > deadline) {
        for (int r = 0; r < nproc_; ++r) {
          if (restart.count(r) || acks.count(r)) continue;
          kill_and_reap(r);
          restart.insert(r);
          if (inc->rank() < 0 || inc->kind() == "comm_error") {
            inc->set_rank(r);
            inc->set_kind("hang");
          }
          inc->set_detail(inc->detail() +
                          detail::concat("; rank ", r, " did not answer the abort within ",
                                         cfg_.recovery().abort_timeout_ms(), " ms (hung): killed"));
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    epoch_ = next;
    inc->set_epoch(next);
    for (int r : restart) spawn(r, /*restarted=*/true);
    int64_t in_flight = 0, completed = 0;
    for (const auto& [r, a] : acks) {
      in_flight = std::max(in_flight, a.second);
      completed = std::max(completed, a.first);
    }
    const int64_t S = restore_step(acks);
    store_->set(recovery::rebuild_key(next), std::to_string(S));
    inc->set_step(int(in_flight));
    inc->set_restored_step(int(S));
    inc->set_steps_lost(int(std::max<int64_t>(0, completed - std::max<int64_t>(S, 0))));
    std::string who;
    for (int r : restart) who += (who.empty() ? "" : ", ") + std::to_string(r);
    inc->set_action(restart.empty()
                        ? "reattempt in place (no culprit)"
                        : "restart rank" + std::string(restart.size() > 1 ? "s " : " ") + who +
                              " in place");
  }

  // The newest step that every rank can restore: from its own snapshot, from its backup
  // holder's copy, or (a survivor) from its memory. -1 when there is none: the job's start.
  int64_t restore_step(const std::map<int, std::pair<int64_t, int64_t>>& acks) {
    std::set<int64_t> common;
    for (int r = 0; r < nproc_; ++r) {
      std::set<int64_t> have;
      const BackupPlacement bp = backup_holder(topo_, r);
      // Checksums are verified: a corrupted slot must not become the restore point.
      for (int64_t s : restorable_steps(job_, r, bp.holder, /*verify=*/true)) have.insert(s);
      auto a = acks.find(r);
      if (a != acks.end()) have.insert(a->second.first);
      if (r == 0) {
        common = have;
      } else {
        std::set<int64_t> both;
        std::set_intersection(common.begin(), common.end(), have.begin(), have.end(),
                              std::inserter(both, both.begin()));
        common.swap(both);
      }
    }
    return common.empty() ? -1 : *common.rbegin();
  }

  void restart_all(report::Incident* inc) {
    stop_all(SIGKILL, std::chrono::seconds(0));
    int64_t progress = 0;
    try {
      progress = std::stoll(store_->get("progress", std::chrono::milliseconds(1)));
    } catch (const CommTimeout&) {
    }
    int64_t S = 0;
    const auto& ck = cfg_.checkpoint();
    if (ck.persistent_every_steps() > 0) {
      std::vector<std::string> skipped;
      try {
        S = find_resume_point(ck.dir(), manifest_info(), &skipped).step;
      } catch (const InputError&) {
        S = 0;
      }
    }
    ++epoch_;
    inc->set_epoch(epoch_);
    for (int r = 0; r < nproc_; ++r) spawn(r, /*restarted=*/false);
    inc->set_step(int(progress));
    inc->set_restored_step(int(S));
    inc->set_steps_lost(int(std::max<int64_t>(0, progress - S)));
    inc->set_action(S > 0 ? detail::concat("restart all ranks from the checkpoint of step ", S)
                          : "restart all ranks from the start");
  }

  CheckpointLayout manifest_info() const {
    CheckpointLayout l;
    l.tp = topo_.tp();
    l.pp = topo_.pp();
    l.dp = topo_.dp();
    l.zero1 = cfg_.parallel().zero1();
    return l;
  }

  int stop_job(const Exit& ex) {
    if (ex.rank >= 0)
      std::fprintf(stderr, "keel-worker: rank %d %s; stopping the job\n", ex.rank,
                   ex.describe().c_str());
    stop_all(SIGTERM, std::chrono::seconds(5));
    return ex.rank >= 0 ? ex.code() : 1;
  }

  pid_t spawn(int rank, bool restarted) {
    const pid_t parent = getpid();
    pid_t pid = fork();
    KEEL_CHECK_ERRNO(pid);
    if (pid == 0) {
      // Die with the supervisor, whatever kills it (SIGKILL included); and if it died
      // between fork() and prctl(), the parent is already someone else: leave at once.
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
      setenv("KEEL_RANK", std::to_string(rank).c_str(), 1);
      setenv("KEEL_WORLD_SIZE", std::to_string(nproc_).c_str(), 1);
      setenv("KEEL_LOCAL_WORLD_SIZE", std::to_string(nproc_).c_str(), 1);
      setenv("KEEL_STORE_ADDR", addr_.c_str(), 1);
      setenv("KEEL_JOB_ID", job_.c_str(), 1);
      setenv("KEEL_SUPERVISED", "1", 1);
      setenv("KEEL_EPOCH", std::to_string(epoch_).c_str(), 1);
      setenv("KEEL_RESTARTED", restarted ? "1" : "0", 1);
      char start[32];
      std::snprintf(start, sizeof(start), "%.6f", job_start_);
      setenv("KEEL_JOB_START", start, 1);
      if (epoch_ > 0 && cfg_.recovery().mode() == config::RecoveryConfig::restart_all &&
          cfg_.checkpoint().persistent_every_steps() > 0)
        setenv("KEEL_RESUME_LATEST", cfg_.checkpoint().dir().c_str(), 1);
      // Ranks share the cores: OpenMP threads that spin while waiting steal them from the
      // rank that has work (measured: a step 5-7x slower at load 9). Read at library load,
      // so it must be in the environment before exec.
      if (nproc_ > 1) setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
      std::vector<char*> args;
      for (const auto& a : argv_) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv("/proc/self/exe", args.data());
      std::perror("keel-worker: exec");
      _exit(127);
    }
    pids_[rank] = pid;
    return pid;
  }

  bool poll_exit(Exit* ex) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return false;
    for (int r = 0; r < nproc_; ++r)
      if (pids_[r] == pid) {
        pids_[r] = -1;
        ex->rank = r;
        ex->status = status;
        return true;
      }
    return false;  // not one of ours any more (killed and reaped on purpose)
  }

  void kill_and_reap(int rank) {
    if (pids_[rank] <= 0) return;
    kill(pids_[rank], SIGKILL);
    int status = 0;
    waitpid(pids_[rank], &status, 0);
    pids_[rank] = -1;
  }

  // Sends `sig` to every live rank, waits up to `grace` for them, then SIGKILLs the rest.
  void stop_all(int sig, std::chrono::seconds grace) {
    for (pid_t p : pids_)
      if (p > 0) kill(p, sig);
    const auto deadline = Clock::now() + grace;
    while (std::any_of(pids_.begin(), pids_.end(), [](pid_t p) { return p > 0; })) {
      Exit ex;
      if (poll_exit(&ex)) continue;
      if (Clock::now() > deadline) {
        for (int r = 0; r < nproc_; ++r) kill_and_reap(r);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  std::vector<std::string> argv_;
  int nproc_;
  config::JobConfig cfg_;
  Topology topo_;
  std::string job_;
  double job_start_;
  std::vector<pid_t> pids_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<TcpStore> store_;
  std::string addr_;
  int epoch_ = 0;
  int incidents_ = 0;
};

}  // namespace

int run_supervisor(const WorkerOptions& o, const std::vector<std::string>& argv) {
  Supervisor s(o, argv);
  return s.run();
}

}  // namespace keel
