// Processes of a job on this machine, for every keel process that starts or names one: fork
// and exec a child that dies with its parent, this binary's path, the process name, and the
// removal of shared memory that ended jobs left behind. Used by the controller's LocalHost
// (keel-worker --nproc), the agents and keel-launch --local.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace keel {

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

// Where a --local job's etcd members keep their data (--etcd-data shm): /dev/shm/keel-etcd-<job>,
// a name that is no shared-memory segment of the job's, removed by remove_stale_segments once
// the job's process is gone.
std::string etcd_shm_dir(const std::string& job);

}  // namespace keel
