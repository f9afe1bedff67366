// keel-worker --nproc N: runs a rendezvous store and N ranks of the same command on this
// machine, and supervises them. If a rank fails, the others are stopped (they would only
// time out) and the exit status says which rank failed and how. This is the way to run
// the parallel code before keel-launch exists, and what the integration tests use.
#pragma once

#include <string>
#include <vector>

namespace keel {

// argv without --nproc; returns the process exit code for the whole job.
int run_local_ranks(int nproc, const std::vector<std::string>& argv);

}  // namespace keel
