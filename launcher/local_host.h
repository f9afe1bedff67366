// Ranks as child processes of this one (keel-worker --nproc): fork + exec of the same
// keel-worker binary, each dying with its parent (PR_SET_PDEATHSIG).
#pragma once

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
  std::map<int, std::set<int64_t>> survey(const Topology& topo) override;
  void finish() override;

 private:
  std::vector<std::string> argv_;
  std::string job_;
  std::vector<pid_t> pids_;
};

// Forks and execs `argv` (argv[0] is the program; "/proc/self/exe" runs this binary) with
// `env` added, in a child that dies with this process. Used by LocalHost and the agents.
pid_t spawn_child(const std::vector<std::string>& argv,
                  const std::map<std::string, std::string>& env, const std::string& log_path = "");

// Removes shared memory of jobs whose supervisor or controller died without cleaning up:
// their job id starts with its PID, and a PID with no process is a job that is over.
void remove_stale_segments();

}  // namespace keel
