#include "launcher/local_spawn.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "parallel/tcp_store.h"
#include "runtime/check.h"

namespace keel {

int run_local_ranks(int nproc, const std::vector<std::string>& argv) {
  TcpStoreServer server("127.0.0.1", 0);
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  std::vector<pid_t> pids(nproc, -1);
  std::fflush(nullptr);
  for (int r = 0; r < nproc; ++r) {
    pid_t pid = fork();
    KEEL_CHECK_ERRNO(pid);
    if (pid == 0) {
      setenv("KEEL_RANK", std::to_string(r).c_str(), 1);
      setenv("KEEL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("KEEL_LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("KEEL_STORE_ADDR", addr.c_str(), 1);
      // Ranks share the cores: OpenMP threads that spin while waiting steal them from the
      // rank that has work (measured: a step 5-7x slower at load 9). Read at library load,
      // so it must be in the environment before exec.
      if (nproc > 1) setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv("/proc/self/exe", args.data());
      std::perror("keel-worker: exec");
      _exit(127);
    }
    pids[r] = pid;
  }

  int exit_code = 0, alive = nproc;
  bool stopping = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (alive > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid == 0) {
      if (stopping && std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids)
          if (p > 0) kill(p, SIGKILL);
        deadline = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid < 0) break;
    int rank = -1;
    for (int r = 0; r < nproc; ++r)
      if (pids[r] == pid) rank = r, pids[r] = -1;
    --alive;
    bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failed && !stopping) {
      if (WIFSIGNALED(status))
        std::fprintf(stderr, "keel-worker: rank %d killed by signal %d (%s); stopping the job\n",
                     rank, WTERMSIG(status), strsignal(WTERMSIG(status)));
      else
        std::fprintf(stderr, "keel-worker: rank %d exited with status %d; stopping the job\n", rank,
                     WEXITSTATUS(status));
      exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      stopping = true;
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGTERM);
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
  }
  return exit_code;
}

}  // namespace keel
