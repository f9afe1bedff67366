// What benchmarks read of a running job from its etcd, as an operator would: the process of
// its leader controller (the PID its election names, launcher/etcd/leader_election.h), for
// those that kill the leader from outside (keel-bench detect's controller_crash row, the
// soak), and how the job ended (the soak, whose slot 0 may die with its machine).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace keel::bench {

// The leader's pid for job `job` in the etcd at `endpoints` ("host:port,..." or members keel
// started, "https://host:port,...", reached with the job's key read from `job_dir`/secret);
// 0 if no candidate leads now (between two leaders) or etcd cannot be read.
pid_t leader_pid(const std::string& endpoints, const std::string& job, const std::string& job_dir);

// The job's exit status as its last leader wrote it (state::JobEnd); nullopt while it runs or
// when etcd cannot be read.
std::optional<int> job_end_code(const std::string& endpoints, const std::string& job,
                                const std::string& job_dir);

// How many faults the job's ranks injected (the count of their injection records in the
// job's store, robust/fault_injector.h); nullopt when etcd cannot be read or the count is
// not there.
std::optional<int64_t> faults_fired(const std::string& endpoints, const std::string& job,
                                    const std::string& job_dir);

}  // namespace keel::bench
