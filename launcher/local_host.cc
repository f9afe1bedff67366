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
#include "launcher/stack_capture.h"
#include "launcher/stack_report.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {

std::string RankExit::describe() const {
  if (slot_lost) return detail::concat("lost with slot ", slot, " (", detail, ")");
  if (WIFSIGNALED(status))
    return detail::concat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                          ")");
  if (WEXITSTATUS(status) == recovery::kExitWriteFailed)
    return detail::concat("exited with status ", WEXITSTATUS(status),
                          " (a checkpoint or output file could not be written: not restarted)");
  return detail::concat("exited with status ", WEXITSTATUS(status));
}

std::string self_exe_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  KEEL_CHECK_ERRNO(n);
  std::string path(buf, size_t(n));
  const std::string deleted = " (deleted)";
  if (path.size() > deleted.size() &&
      path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
    path.resize(path.size() - deleted.size());
  return path;
}

void set_process_name(const char* name) {
  // Longer names are cut to 15 characters by the kernel; only a bad pointer fails.
  KEEL_CHECK_ERRNO(prctl(PR_SET_NAME, name, 0, 0, 0));
}

pid_t spawn_child(const std::vector<std::string>& argv,
                  const std::map<std::string, std::string>& env, const std::string& log_path,
                  int death_signal) {
  const pid_t parent = getpid();
  const std::string self = self_exe_path();
  std::vector<std::string> args_owned = argv;
  if (args_owned[0] == "/proc/self/exe") args_owned[0] = self;
  // Built before fork(): the child of a threaded process should not allocate.
  std::vector<char*> args;
  for (const auto& a : args_owned) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string exec_failed = "keel: exec " + args_owned[0];
  std::fflush(nullptr);
  pid_t pid = fork();
  KEEL_CHECK_ERRNO(pid);
  if (pid != 0) return pid;
  // Die with the parent, whatever kills it (SIGKILL included); and if it died between
  // fork() and prctl(), the parent is already someone else: leave at once.
  if (prctl(PR_SET_PDEATHSIG, death_signal) != 0 || getppid() != parent) _exit(1);
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  if (!log_path.empty()) {
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
  }
  execv(args[0], args.data());
  // This binary's file was deleted (a rebuild): /proc/self/exe is still the same binary.
  if (errno == ENOENT && args_owned[0] == self) execv("/proc/self/exe", args.data());
  // Straight to stderr, not through glog: in the child of a threaded process, after fork(),
  // glog's locks may be held by a thread that is not here.
  std::perror(exec_failed.c_str());
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
    if (n > 0) LOG(INFO) << "removed " << n << " shared-memory segment(s) of ended job " << job;
  }
}

LocalHost::LocalHost(std::vector<std::string> argv, int world, std::string job)
    : argv_(std::move(argv)), job_(std::move(job)), pids_(size_t(world), -1) {
  argv_[0] = self_exe_path();  // argv[0] as typed may be relative or found on PATH
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

std::map<int, policy::Holdings> LocalHost::survey(const Topology& topo, bool replica_backups) {
  std::map<int, policy::Holdings> out;
  for (int r = 0; r < topo.world_size(); ++r) {
    // Slot headers only: a restore verifies the slot it loads, falls back to the next
    // source and drops a damaged slot, so no pass over the payloads is made here.
    for (int64_t s : restorable_steps(job_, r, -1)) out[r].own.insert(s);
    const BackupPlacement bp = backup_holder(topo, r, replica_backups);
    if (bp.holder < 0) continue;
    for (int64_t s : held_steps(job_, r, bp.holder, bp.replica)) out[r].backup.insert(s);
  }
  return out;
}

void LocalHost::finish() {
  unlink_job_segments(job_);
}

std::map<int, control::RankStacks> LocalHost::capture_stacks(std::chrono::milliseconds timeout) {
  std::vector<int> ranks;
  std::vector<pid_t> pids;
  for (size_t r = 0; r < pids_.size(); ++r)
    if (pids_[r] > 0) {
      ranks.push_back(int(r));
      pids.push_back(pids_[r]);
    }
  const std::vector<ProcessStacks> stacks = keel::capture_stacks(pids, timeout);
  std::map<int, control::RankStacks> out;
  for (size_t i = 0; i < ranks.size(); ++i) out[ranks[i]] = to_message(ranks[i], stacks[i]);
  return out;
}

}  // namespace keel
