// Test helper: runs the ranks of a group as forked child processes on loopback, so tests see
// real process death, stops and sockets. Each child runs fn(rank) and exits with its return
// value, or with the code of the keel exception it threw; it never returns into GoogleTest.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/syscall.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm_error.h"
#include "parallel/sealed_channel.h"

namespace keel::test {

// Exit codes of a rank; 0 is success and 1 a wrong result the child detected.
inline constexpr int kOk = 0;
inline constexpr int kWrong = 1;
inline constexpr int kExitTimeout = 10;
inline constexpr int kExitPeerFailure = 11;
inline constexpr int kExitAborted = 12;
inline constexpr int kExitCommError = 13;  // a CommError that is none of the above
inline constexpr int kExitOtherError = 14;
inline constexpr int kExitNotFinished = 99;  // still running when the test gave up on it

// Whether thread `tid` of this process sleeps in a system call (a recv or poll waiting for a
// peer), read from /proc: "S" in its stat and a syscall number in its syscall file. A test
// that acts on a thread "once it is blocked" waits for this instead of sleeping.
inline bool thread_blocked_in_syscall(pid_t tid) {
  const std::string dir = "/proc/self/task/" + std::to_string(tid);
  std::ifstream stat(dir + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'S')
    return false;
  std::ifstream sc(dir + "/syscall");
  std::string first;
  return static_cast<bool>(sc >> first) && first != "running" && first != "-1";
}

inline pid_t this_thread_id() {
  return static_cast<pid_t>(::syscall(SYS_gettid));
}

// Polls until thread `tid` is blocked in a system call or `deadline` passes.
inline bool wait_until_blocked(pid_t tid,
                               std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!thread_blocked_in_syscall(tid)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The exit code for the exception in flight; call inside a catch block.
inline int exit_code_of_current_exception() {
  try {
    throw;
  } catch (const CommTimeout&) {
    return kExitTimeout;
  } catch (const PeerFailure&) {
    return kExitPeerFailure;
  } catch (const CommAborted&) {
    return kExitAborted;
  } catch (const CommError&) {
    return kExitCommError;
  } catch (...) {
    return kExitOtherError;
  }
}

class RankProcs {
 public:
  RankProcs(int n, const std::function<int(int rank)>& fn) {
    std::fflush(nullptr);  // or buffered output would be written once per child
    prepare_sealing();     // a child must not set OpenSSL up (sealed_channel.h)
    for (int r = 0; r < n; ++r) {
      pid_t pid = ::fork();
      if (pid == 0) {
        int code;
        try {
          code = fn(r);
        } catch (const std::exception& e) {
          code = exit_code_of_current_exception();
          std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        }
        std::fflush(nullptr);
        ::_exit(code);  // no atexit handlers: they belong to the parent (temp dirs, gtest)
      }
      pids_.push_back(pid);
      codes_.push_back(-1);
    }
  }
  ~RankProcs() {
    for (size_t r = 0; r < pids_.size(); ++r)
      if (codes_[r] < 0) {
        ::kill(pids_[r], SIGKILL);
        ::waitpid(pids_[r], nullptr, 0);
      }
  }
  RankProcs(const RankProcs&) = delete;
  RankProcs& operator=(const RankProcs&) = delete;

  pid_t pid(int rank) const { return pids_[rank]; }
  void kill(int rank, int sig) { ::kill(pids_[rank], sig); }

  // The rank's exit code, 128 + signal if a signal ended it, or kExitNotFinished if it is
  // still running after `limit` (it is then killed). The limit only guards against a hang
  // of the code under test; it is far above what a passing test takes.
  int wait(int rank, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    if (codes_[rank] >= 0) return codes_[rank];
    auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
      int status = 0;
      pid_t got = ::waitpid(pids_[rank], &status, WNOHANG);
      if (got == pids_[rank]) {
        codes_[rank] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return codes_[rank];
      }
      if (std::chrono::steady_clock::now() > end) {
        ::kill(pids_[rank], SIGKILL);
        ::waitpid(pids_[rank], nullptr, 0);
        codes_[rank] = kExitNotFinished;
        return codes_[rank];
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  std::vector<int> wait_all() {
    std::vector<int> out;
    for (size_t r = 0; r < pids_.size(); ++r) out.push_back(wait(static_cast<int>(r)));
    return out;
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<int> codes_;
};

}  // namespace keel::test
