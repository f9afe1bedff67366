#include "launcher/controller/local_host.h"

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
#include "launcher/controller/stack_report.h"
#include "launcher/job_env.h"
#include "launcher/stack_capture.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// Between looks at the children while stopping them: an exit is reaped within this of it.
constexpr std::chrono::milliseconds kStopPollPause{5};

}  // namespace

std::string RankExit::describe() const {
  if (slot_lost) return detail::concat("lost with slot ", slot, " (", detail, ")");
  if (WIFSIGNALED(status))
    return detail::concat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                          ")");
  if (WEXITSTATUS(status) == recovery::kExitWriteFailed)
    return detail::concat("exited with status ", WEXITSTATUS(status),
                          " (a checkpoint or output file could not be written: not restarted)");
  // What keel's own codes mean, so that a report's stop_reason says it without the logs.
  if (WEXITSTATUS(status) == recovery::kExitNonFinite)
    return detail::concat("exited with status ", WEXITSTATUS(status),
                          " (a loss or gradient norm not finite twice at one step: not restarted)");
  if (WEXITSTATUS(status) == recovery::kExitInputError)
    return detail::concat("exited with status ", WEXITSTATUS(status),
                          " (bad input: not restarted)");
  return detail::concat("exited with status ", WEXITSTATUS(status));
}

LocalHost::LocalHost(std::vector<std::string> argv, int world, std::string job)
    : argv_(std::move(argv)), job_(std::move(job)), pids_(size_t(world), -1) {
  argv_[0] = self_exe_path();  // argv[0] as typed may be relative or found on PATH
}

void LocalHost::spawn(int rank, const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> e = env;
  e[env::kLocalWorldSize] = std::to_string(pids_.size());
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
    std::this_thread::sleep_for(kStopPollPause);
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
