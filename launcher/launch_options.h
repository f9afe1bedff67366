// keel-launch's command line. A slot is one machine: under mpirun each MPI rank is a slot;
// with --local N this process forks N slots on this machine; with --join a slot's launcher
// is started by hand (to bring back a lost machine) and joins a running job's controller.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace keel {

struct LaunchOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set path=value
  int local = 0;                       // --local N: N slots on this machine
  int slots = 0;                       // --slots N: this process is slot 0 of N; the
                                       // others join by hand (--join)
  int workers_per_slot = 0;            // --workers-per-slot W (0: one per GPU, or 1 on CPU)
  int standby = 0;                     // --standby K: the last K slots are warm standbys
  std::string run_dir = "runs";        // --run-dir DIR: runs/<job>/ holds logs and events
  std::string join;                    // --join ENDPOINT: the controller of a running job
  int slot = -1;                       // --slot K (with --join)
  std::string job;                     // --job ID (with --join; default: from the endpoint)
  std::string secret_file;             // --secret-file FILE (with --join): the job's key, a copy of
                                       // runs/<job>/secret (parallel/job_key.h)
  std::vector<std::string> worker_args;  // passed to every keel-worker (--report, --fault, ...),
                                         // flag then value, in the order given
  std::string resume;  // --resume DIR: a checkpoint directory, or a run directory runs/<job>/
                       // (its config.pbtxt names the checkpoint directory and, without
                       // --config, is the job's config)
  bool quiet = false;
  // The job's control state in etcd (jobs of 3+ slots): members keel starts beside the first
  // slots, or an existing cluster's endpoints, and where members keep their data.
  int etcd_members = 0;  // --etcd-members 3|5 (0: 5 for jobs of 5+ slots, else 3)
  // --failure-domain LABEL: this machine's (under --local, LABEL,... one per slot, or one for
  // all); "": Slurm's topology if it gives one, else not known.
  std::string failure_domain;
  std::string etcd;       // --etcd host:port,...
  std::string etcd_data;  // --etcd-data run|shm ("": shm under --local, else run)
  // --candidate: a controller candidate of job --job on slot --slot (started by the slot's
  // agent, never by hand): it campaigns in --etcd, and if it wins, leads the job from what
  // etcd holds. --host: its slot's address, where its control plane listens.
  bool candidate = false;
  std::string host;
};

// Parses argv (CLI11, runtime/cli.h). Returns nothing to go on, or the exit status to end
// with: 0 after --help, 2 (recovery::kExitInputError) after a usage error, which it has
// reported on stderr as "keel-launch: error: ..." naming the flag.
std::optional<int> parse_launch_options(int argc, char** argv, LaunchOptions* out);

}  // namespace keel
