// keel-launch's wait for the job's first controller, which runs in a child process of its
// own (launcher/launch.cc): its exit, or the job's end seen in the slots this process runs
// when the controller outlives it (deposed without learning it).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <optional>
#include <vector>

namespace keel {

// Waits for the controller's exit and returns its wait status (waitpid's); or, if every slot this
// process runs ended with the job's status and the controller lives on past kOutlivesTheJob (5 s),
// stops it and sets *job_code. Such a controller was deposed without learning it: its lease lapsed
// while etcd had no quorum, a candidate took the job over and ended it, and etcd's members
// went with the slots before it saw so (it would wait detect.quorum_timeout_ms for them and
// end the job a second time, with exit 6).
// `slots`: those this process forked (--local), looked at, not reaped; `agent0_code`: slot 0's
// agent in this process, its exit status once it ended (-1 before), when `agent0_here`;
// `signal`: a signal keel-launch took, passed on to the controller once.
int wait_controller(pid_t controller, const std::vector<pid_t>& slots,
                    const std::atomic<int>& agent0_code, bool agent0_here,
                    const volatile sig_atomic_t* signal, std::optional<int>* job_code);

}  // namespace keel
