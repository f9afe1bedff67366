#include "launcher/controller/tcp_refusals.h"

namespace keel {

std::optional<TcpRefusals::Event> TcpRefusals::report(int64_t pid, const std::string& who,
                                                      int64_t total, Clock::time_point now) {
  Seen& s = seen_[pid];
  if (total <= s.reported) return std::nullopt;
  if (s.at != Clock::time_point{} && now - s.at < std::chrono::seconds(1)) return std::nullopt;
  Event e{who, total - s.reported};
  s.reported = total;
  s.at = now;
  return e;
}

}  // namespace keel
