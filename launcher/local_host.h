// Ranks as child processes of this one (keel-worker --nproc): fork + exec of the same
// keel-worker binary, each dying with its parent (PR_SET_PDEATHSIG). Every child shows in
// ps under the real path of its binary, never as /proc/self/exe.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "launcher/rank_host.h"

namespace keel {

class LocalHost : public RankHost {
 public:
  // `argv`: the keel-worker command line for a rank; `job`: names the job's shared memory.
  LocalHost(std::vector<std::string> argv, int world, std::string job);
  void spawn(int rank, const std::map<std::string, std::string>& env) override;
  void kill(int rank) override;
  std::optional<RankExit> poll_exit() override;
  void stop_all(int sig, std::chrono::milliseconds grace) override;
  std::map<int, policy::Holdings> survey(const Topology& topo, bool replica_backups) override;
  void finish() override;
  // Traces its children directly (it is their parent). Call it from the thread that calls
  // poll_exit: a concurrent waitpid(-1) would take the capture's ptrace stops.
  std::map<int, control::RankStacks> capture_stacks(std::chrono::milliseconds timeout) override;

 private:
  std::vector<std::string> argv_;
  std::string job_;
  std::vector<pid_t> pids_;
};

// Forks and execs `argv` (argv[0] is the program) with `env` added, in a child that gets
// `death_signal` when this process dies, whatever kills it (SIGTERM lets a child clean up).
// "/proc/self/exe" as argv[0] is replaced by self_exe_path(), so that ps shows what each
// process is (argv[0] and, from the file name, its command name); only if that file is gone
// (deleted by a rebuild) does the child run /proc/self/exe. Used by LocalHost, the agents
// and keel-launch --local.
pid_t spawn_child(const std::vector<std::string>& argv,
                  const std::map<std::string, std::string>& env, const std::string& log_path = "",
                  int death_signal = SIGKILL);

// The absolute path of this process's binary, e.g. /opt/keel/bin/keel-launch (without the
// " (deleted)" that the kernel appends once a rebuild replaced the file). Throws keel::Error
// if /proc/self/exe cannot be read.
std::string self_exe_path();

// Names the calling thread (and, from the main thread, the process) in ps -o comm, top and
// /proc/PID/comm: at most 15 characters, e.g. "keel-worker".
void set_process_name(const char* name);

// Removes shared memory of jobs whose supervisor or controller died without cleaning up:
// their job id starts with its PID, and a PID with no process is a job that is over.
void remove_stale_segments();

}  // namespace keel
