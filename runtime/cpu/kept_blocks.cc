#include "runtime/cpu/kept_blocks.h"

#include <cstdlib>
#include <cstring>

namespace keel::cpu {

void* KeptBlocks::take(size_t bytes) {
  if (bytes < kMinBytes || !keeping_.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(bytes);
  if (it == held_.end()) return nullptr;
  void* p = it->second;
  held_.erase(it);
  return p;
}

void KeptBlocks::note(void* p, size_t bytes) {
  if (bytes < kMinBytes || !keeping_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  sizes_[p] = bytes;
}

bool KeptBlocks::keep(void* p) {
  if (p == nullptr) return true;  // free(nullptr): nothing to do
  if (!keeping_.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sizes_.find(p);
  if (it == sizes_.end()) return false;
  const size_t bytes = it->second;
  sizes_.erase(it);
  std::memset(p, 0, bytes);
  held_.emplace(bytes, p);
  return true;
}

void KeptBlocks::set_keeping(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  keeping_ = on;
  if (on) return;
  for (auto& [bytes, p] : held_) std::free(p);
  held_.clear();
  sizes_.clear();
}

}  // namespace keel::cpu
