// An injected link degradation (fault slow_link, robust/fault_injector.h): from when it is set,
// every message this process sends over a socket communicator waits this long before it
// leaves. Process-wide, as a slow NIC is the machine's: every group of the rank is slowed,
// and the time counts as time inside the communicator call, where a real slow link's does.
#pragma once

#include <chrono>

namespace keel {

void set_link_delay(std::chrono::milliseconds delay);
std::chrono::milliseconds link_delay();

}  // namespace keel
