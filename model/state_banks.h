// Two copies of a TrainState's bytes kept where they outlive the process: the rank's two
// snapshot slots in shared memory (ckpt/snapshotter.h implements this). A TrainState attached
// to banks lives in one of them and the optimizer writes the next step into the other, so
// the update itself is the snapshot and nothing is copied (DESIGN.md, Checkpoints).
#pragma once

#include <cstdint>

namespace keel {

class StateBanks {
 public:
  virtual ~StateBanks() = default;
  // Start of bank `i` (0 or 1; a bank beyond them is only ever adopted, see
  // TrainState::adopt_bank): the state's spans back to back, in TrainState::spans() order.
  virtual char* bank(int i) = 0;
  // Of banks 0 and 1, the one not holding the newest valid snapshot: to overwrite first.
  virtual int free_bank() const = 0;
  // Bank `i` stops being a valid snapshot because it is about to be overwritten. May wait
  // (bounded) for a reader of it, such as a backup push, to finish.
  virtual void begin_write(int i) = 0;
  // Bank `i` holds the state after `step` optimizer steps, with block checksum `checksum`
  // (runtime/block_digest.h): a valid snapshot from now on.
  virtual void commit(int i, int64_t step, uint64_t checksum) = 0;
};

}  // namespace keel
