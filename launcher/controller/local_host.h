// Ranks as child processes of this one (keel-worker --nproc): fork + exec of the same
// keel-worker binary, each dying with its parent (PR_SET_PDEATHSIG). Every child shows in
// ps under the real path of its binary, never as /proc/self/exe.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "launcher/controller/rank_host.h"
#include "launcher/processes.h"

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

}  // namespace keel
