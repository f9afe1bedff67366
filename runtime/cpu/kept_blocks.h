// The CPU backend's kept blocks (Backend::keep_freed_blocks): while keeping is on, a large
// block freed is held with its pages faulted in and handed to the next allocation of the
// same size. A warm standby rehearses a rank's allocations this way while it waits; the rank
// it becomes then reuses memory instead of faulting 4 KiB pages in on the recovery's path
// (~0.3 s for the 230 MB state and the activations of a medium GPT).
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>

namespace keel::cpu {

class KeptBlocks {
 public:
  KeptBlocks() = default;
  KeptBlocks(const KeptBlocks&) = delete;
  KeptBlocks& operator=(const KeptBlocks&) = delete;
  ~KeptBlocks() { set_keeping(false); }

  // A block of exactly `bytes` held since it was freed, zero-filled (nullptr: none; small
  // sizes are never held). The caller owns it again.
  void* take(size_t bytes);
  // Remembers the size of a large block just handed out while keeping is on, for keep().
  void note(void* p, size_t bytes);
  // Holds `p` if keeping is on and it is a large block note() saw, zero-filling it now (a
  // standby's rehearsal frees while it waits: the rank it becomes then skips the memset);
  // false: the caller frees.
  bool keep(void* p);
  // Off frees every block held and forgets the sizes noted: a block handed out meanwhile is
  // the caller's to free as any other.
  void set_keeping(bool on);

 private:
  // Only blocks this large are worth holding: below it faulting costs little, and the many
  // small buffers would make every free take the lock.
  static constexpr size_t kMinBytes = 1 << 20;

  std::mutex mu_;
  // Read without the lock on every alloc and free: off (every rank but a parked or just
  // promoted standby), they cost one load and nothing more.
  std::atomic<bool> keeping_{false};
  std::unordered_map<void*, size_t> sizes_;  // large blocks handed out while keeping, not freed
  std::multimap<size_t, void*> held_;        // freed while keeping, by size
};

}  // namespace keel::cpu
