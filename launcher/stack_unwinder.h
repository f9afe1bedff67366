// Unwinds one ptrace-stopped thread into text frames with libunwind, for stack_capture.cc.
// A module replaced on disk since the process mapped it (a keel-worker rebuilt while the job
// runs, a library upgraded under it: "(deleted)" in /proc/PID/maps) cannot be read by path,
// which is all libunwind knows: its unwind table is then read from the process's memory and
// its symbols from the mapped file itself (/proc/PID/map_files), so its frames still name
// their functions.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace keel {

class StackUnwinder {
 public:
  // One per capture of `pid`, used on the thread that traces it: its caches hold for every
  // thread of the process.
  explicit StackUnwinder(pid_t pid);
  ~StackUnwinder();
  StackUnwinder(const StackUnwinder&) = delete;
  StackUnwinder& operator=(const StackUnwinder&) = delete;

  // Appends the frames of `tid` (stopped, traced by this thread), innermost first, as
  // "function+0xOFF (module)" or "?? (module+0xOFF)". Returns "" or why it stopped short.
  std::string unwind(int tid, std::vector<std::string>* frames);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel
