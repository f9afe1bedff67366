// Refusals on the job's TCP planes (the rendezvous store, backup servers, communicators;
// parallel/peer_auth.h) as events of the job: each process counts what it refused and logs
// the peers, the ranks report their counts with their progress, and this turns a rise into
// one `refused` event (plane "tcp") per process and second at most, as the control plane's
// own refusals are (launcher/controller/controller.cc). Runs in the controller.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace keel {

class TcpRefusals {
 public:
  using Clock = std::chrono::steady_clock;

  struct Event {
    std::string at;     // the process that refused ("rank 3 (pid 1234)", "the controller")
    int64_t count = 0;  // refusals since the last event of that process
  };

  // Process `pid` (named `who`) has refused `total` connections since it started. Returns
  // the event to write, if one is due: the count rose and a second has passed since the last
  // event of that process (what rises meanwhile goes into the next).
  std::optional<Event> report(int64_t pid, const std::string& who, int64_t total,
                              Clock::time_point now = Clock::now());

 private:
  struct Seen {
    int64_t reported = 0;  // the total the last event covered
    Clock::time_point at{};
  };
  std::map<int64_t, Seen> seen_;
};

}  // namespace keel
