// One writer per checkpoint directory. Two jobs sharing checkpoint.dir would write the same
// step_NNNNNN directories and prune each other's; so the process that owns a job (keel-launch
// of slot 0, keel-worker --nproc) takes an exclusive flock on DIR/.keel-owner for the job's
// life and writes its name there. A second job pointed at the directory is refused at start,
// told which job holds it. The kernel drops the lock when the owner's process ends, however
// it ends (kill -9 included), so a crashed job never leaves the directory locked.
#pragma once

#include <string>

namespace keel {

class CheckpointDirLock {
 public:
  // Creates `dir` if needed and locks it for `job` (of `lineage`). Throws keel::InputError
  // naming the directory and the job that holds it when another live process does.
  CheckpointDirLock(const std::string& dir, const std::string& job, const std::string& lineage);
  ~CheckpointDirLock();  // releases the lock (the owner file stays: it says who wrote last)
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace keel
