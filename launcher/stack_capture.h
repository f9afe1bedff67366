// The native stack of every thread of a running (or stopped) process, read from outside with
// ptrace and libunwind, for the hang diagnosis of last resort (DESIGN.md, Failure handling):
// when no cheaper rule names a culprit, the stacks of all workers are compared by text
// (robust/stack_groups.h). The caller must be allowed to trace the process: its parent (an
// agent, LocalHost) or root.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "proto/control.pb.h"

namespace keel {

// One thread's stack, innermost frame first. A frame reads "function+0xOFF (module)", or
// "?? (module+0xOFF)" where no symbol is known: no absolute addresses, so equal stacks of
// different processes of the same binaries have equal text.
struct ThreadStack {
  int tid = 0;
  std::string name;                 // the thread's name (/proc/PID/task/TID/comm)
  std::vector<std::string> frames;  // empty if it could not be read (see error)
  std::string error;                // why the stack is missing or cut short; "" if complete
};

// Every thread of one process; `error` says why there are none (no such process, not
// permitted to trace it).
struct ProcessStacks {
  pid_t pid = 0;
  std::vector<ThreadStack> threads;  // the main thread (tid == pid) first, then by tid
  std::string error;
};

// Stops each thread of `pid` for as long as it takes to unwind it (PTRACE_SEIZE +
// PTRACE_INTERRUPT, all threads at once so the stacks are one moment's) and lets it go
// again: a running process runs on, one stopped by SIGSTOP stays stopped, and a signal that
// arrived meanwhile is delivered. Gives up on what is not done within `timeout` (a thread in
// uninterruptible sleep never stops: it is reported with an error and left untraced). Never
// throws for what the process does (exits, refuses tracing): those are errors in the result.
// Does not reap the process if it is the caller's child and ends meanwhile.
ProcessStacks capture_stacks(pid_t pid, std::chrono::milliseconds timeout);

// capture_stacks of several processes at once (each on its own tracing thread): the
// result for pids[i] is at [i]; all done within about `timeout`.
std::vector<ProcessStacks> capture_stacks(const std::vector<pid_t>& pids,
                                          std::chrono::milliseconds timeout);

// The stacks as text, one block per thread ("thread TID (NAME)" then a frame a line,
// indented), as written to runs/<job>/stacks/<incident>/rank<R>.txt.
std::string format_stacks(const ProcessStacks& stacks);

// A capture as its control-plane message (the agents send these), and back.
control::RankStacks to_message(int rank, const ProcessStacks& stacks);
ProcessStacks from_message(const control::RankStacks& msg);

}  // namespace keel
