#include "launcher/local_host.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "ckpt/backup_placement.h"
#include "ckpt/restore.h"
#include "ckpt/snapshot_region.h"
#include "runtime/check.h"

namespace keel {

std::string RankExit::describe() const {
  if (slot_lost) return detail::concat("lost with slot ", slot, " (", detail, ")");
  if (WIFSIGNALED(status))
    return detail::concat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                          ")");
  return detail::concat("exited with status ", WEXITSTATUS(status));
}

pid_t spawn_child(const std::vector<std::string>& argv,
                  const std::map<std::string, std::string>& env, const std::string& log_path) {
  const pid_t parent = getpid();
  std::fflush(nullptr);
  pid_t pid = fork();
  KEEL_CHECK_ERRNO(pid);
  if (pid != 0) return pid;
  // Die with the parent, whatever kills it (SIGKILL included); and if it died between
  // fork() and prctl(), the parent is already someone else: leave at once.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  if (!log_path.empty()) {
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(argv[0].c_str(), args.data());
  std::perror(("keel: exec " + argv[0]).c_str());
  _exit(127);
}

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
      std::fprintf(stderr, "keel: removed %d shared-memory segment(s) of ended job %s\n", n,
                   job.c_str());
  }
}

LocalHost::LocalHost(std::vector<std::string> argv, int world, std::string job)
    : argv_(std::move(argv)), job_(std::move(job)), pids_(size_t(world), -1) {
  argv_[0] = "/proc/self/exe";
}

void LocalHost::spawn(int rank, const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> e = env;
  e["KEEL_LOCAL_WORLD_SIZE"] = std::to_string(pids_.size());
  pids_[size_t(rank)] = spawn_child(argv_, e);
}

void LocalHost::kill(int rank) {
  pid_t& pid = pids_[size_t(rank)];
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  pid = -1;
}

std::optional<RankExit> LocalHost::poll_exit() {
  int status = 0;
  pid_t pid = waitpid(-1, &status, WNOHANG);
  if (pid <= 0) return std::nullopt;
  for (size_t r = 0; r < pids_.size(); ++r)
    if (pids_[r] == pid) {
      pids_[r] = -1;
      RankExit e;
      e.rank = int(r);
      e.status = status;
      return e;
    }
  return std::nullopt;  // not one of ours any more (killed and reaped on purpose)
}

void LocalHost::stop_all(int sig, std::chrono::milliseconds grace) {
  for (pid_t p : pids_)
    if (p > 0) ::kill(p, sig);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::any_of(pids_.begin(), pids_.end(), [](pid_t p) { return p > 0; })) {
    if (poll_exit()) continue;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t r = 0; r < pids_.size(); ++r) kill(int(r));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::map<int, std::set<int64_t>> LocalHost::survey(const Topology& topo) {
  std::map<int, std::set<int64_t>> out;
  for (int r = 0; r < topo.world_size(); ++r) {
    // Checksums are verified: a corrupted slot must not become the restore point.
    for (int64_t s : restorable_steps(job_, r, backup_holder(topo, r).holder, /*verify=*/true))
      out[r].insert(s);
  }
  return out;
}

void LocalHost::finish() {
  unlink_job_segments(job_);
}

}  // namespace keel
