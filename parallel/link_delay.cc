#include "parallel/link_delay.h"

#include <atomic>

namespace keel {
namespace {

std::atomic<int64_t> g_delay_ms{0};

}  // namespace

void set_link_delay(std::chrono::milliseconds delay) {
  g_delay_ms.store(delay.count());
}

std::chrono::milliseconds link_delay() {
  return std::chrono::milliseconds(g_delay_ms.load(std::memory_order_relaxed));
}

}  // namespace keel
