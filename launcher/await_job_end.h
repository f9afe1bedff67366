// keel-launch after the controller it started died or was deposed (DESIGN.md, Control state
// and failover): a candidate beside another member leads the job now. keel-launch waits for
// the job's end as that leader says it, in etcd, or in the exit status of this machine's
// slots, which take it with their shutdown (the members may be gone with them before etcd is
// read); meanwhile it prints the job's progress, which the new leader's log has otherwise.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace keel {

struct JobEndWait {
  std::string job;
  std::vector<std::string> etcd;        // the job's etcd endpoints
  int signal = 0;                       // what killed the controller (0: it was deposed)
  std::vector<pid_t>* slots = nullptr;  // the slots this process forked (--local), reaped here
  const std::atomic<int>* agent0_code = nullptr;  // slot 0's agent in this process: its exit
  bool agent0_here = false;                       // status once it ended (-1 before)
  int64_t echo_steps = 0;  // the job's steps, for the progress lines (0: none, --quiet)
  const volatile sig_atomic_t* stop = nullptr;  // SIGINT/SIGTERM/SIGHUP to keel-launch
};

// The job's exit status: the end its leader wrote to etcd, or a slot's here that ended with
// the job's status. A slot taken as lost (agent::kExitSlotGone) or stopped without its
// controller is not the job's status: the wait goes on while someone leads the job. 1 when
// every slot here ended and no one leads it for a minute; 128 + the signal on a stop.
int await_job_end(const JobEndWait& w);

}  // namespace keel
