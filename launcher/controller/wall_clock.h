// Unix time in seconds, the controller's clock for timelines across processes (incidents,
// events), as launcher/recovery_protocol.h's unix_now() is the workers'.
#pragma once

#include <chrono>

namespace keel {

inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace keel
