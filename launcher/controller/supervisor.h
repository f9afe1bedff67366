// keel-worker --nproc N: runs the job's rendezvous store, its controller
// (launcher/controller/controller.h) and N ranks of the same command on this machine, and keeps the
// job alive through their failures (recovery.mode):
//   in_place     a rank that dies, exits with an error or hangs is restarted alone; the
//                others abort their communicators, rebuild them for the next epoch and
//                restore the newest step every rank can restore (launcher/recovery_protocol.h);
//   restart_all  every rank is stopped and the whole job restarted from its newest
//                persistent checkpoint.
// A rank that fails on bad input (exit 2) or non-finite numbers (exit 4) stops the job: it
// would fail again. SIGINT/SIGTERM are forwarded to the ranks; each rank dies with the
// supervisor (PR_SET_PDEATHSIG), so no rank outlives it. At the end the job's shared memory
// is unlinked.
#pragma once

#include <string>
#include <vector>

#include "ckpt/persistent_checkpoint.h"
#include "launcher/worker_options.h"

namespace keel {

// `argv` is the command line without --nproc; returns the process exit code for the job.
int run_supervisor(const WorkerOptions& o, const std::vector<std::string>& argv);

}  // namespace keel
