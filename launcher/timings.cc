#include "launcher/timings.h"

#include <sstream>

namespace keel::timings {
namespace {

// Adds "a (x ms) must be below b (y ms): why" when a >= b.
void below(std::vector<std::string>* out, const char* a, milliseconds x, const char* b,
           milliseconds y, const char* why) {
  if (x < y) return;
  std::ostringstream os;
  os << a << " (" << x.count() << " ms) must be below " << b << " (" << y.count()
     << " ms): " << why;
  out->push_back(os.str());
}

// Adds "a (x ms) must be at most b (y ms): why" when a > b.
void at_most(std::vector<std::string>* out, const char* a, milliseconds x, const char* b,
             milliseconds y, const char* why) {
  if (x <= y) return;
  std::ostringstream os;
  os << a << " (" << x.count() << " ms) must be at most " << b << " (" << y.count()
     << " ms): " << why;
  out->push_back(os.str());
}

}  // namespace

std::vector<std::string> check_timings(const config::DetectConfig& d, bool with_etcd) {
  std::vector<std::string> out;
  const milliseconds slot_timeout(d.slot_timeout_ms());
  const milliseconds liveness(d.liveness_timeout_ms());
  const milliseconds controller_timeout(d.controller_timeout_ms());
  // The table's own order.
  below(&out, "3 heartbeats", 3 * kHeartbeatEvery, "the leader's silence before an agent moves",
        kLeaderSilence,
        "a live leader answers every heartbeat; two lost answers must not move an agent");
  below(&out, "the leader's silence before an agent moves", kLeaderSilence, "the leader's lease",
        kControllerLease,
        "an agent must be ready to move by the time a dead leader's lease lapses");
  below(&out, "2 etcd election timeouts", 2 * kEtcdElectionTimeout, "the leader's lease",
        kControllerLease, "the lease must outlast etcd's own election after a lost Raft leader");
  below(&out, "etcd's heartbeat x 5", 5 * kEtcdHeartbeat, "its election timeout",
        kEtcdElectionTimeout, "Raft's rule: the election timeout is several heartbeats");
  below(&out, "a reconnect", kReconnectEvery, "the unanswered grace", kReopenGrace,
        "a live agent whose link reset reconnects within the grace");
  below(&out, "the unanswered grace", kReopenGrace, "the answered grace", kAnsweredGrace,
        "a port that answered proves more than silence does");
  below(&out, "the silence before a close", kSilentBeforeClose, "the ZMTP timeout", kZmtpTimeout,
        "a close after that much silence is the transport's own");
  // The job's settings against the table.
  at_most(&out, "3 reports", 3 * kHeartbeatEvery, "detect.liveness_timeout_ms", liveness,
          "a rank is judged silent only after missing several reports (one every 200 ms)");
  at_most(&out, "5 heartbeats", 5 * kHeartbeatEvery, "detect.slot_timeout_ms", slot_timeout,
          "a slot is lost only after several missed heartbeats");
  below(&out, "the unanswered grace", kReopenGrace, "detect.slot_timeout_ms", slot_timeout,
        "a reset link must be told from a lost slot before the slot timeout");
  if (with_etcd && controller_timeout.count() > 0)
    below(&out, "the leader's lease and an agent's move", kControllerLease + kLeaderSilence,
          "detect.controller_timeout_ms", controller_timeout,
          "agents must not stop their slots before a dead leader's successor can speak to them");
  return out;
}

}  // namespace keel::timings
