// The control plane's timings in one table (DESIGN.md, Control state and failover): how often
// agents speak, how long silence means what, how long a leader's lease lasts. Each is chosen
// against others, and those inequalities are what keeps failover correct: a live leader is
// never left, a dead one is replaced before the agents give up on it, a reset link is not a
// lost slot. check_timings() checks them, with the job's own detect.* settings, when a job
// starts; tests/launcher/timings_test.cc checks the table itself. Read by every keel process.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "proto/config.pb.h"

namespace keel::timings {

using std::chrono::milliseconds;

// An agent's heartbeat to the leader (and its answer, the leader's keepalive).
inline constexpr milliseconds kHeartbeatEvery{200};
// An agent takes up a new leader etcd names once the one it talks to has been silent this
// long: a live leader answers every heartbeat, so a live one is never left.
inline constexpr milliseconds kLeaderSilence{1000};
// An agent also reads the leadership this often beside its watch: a watch served by a member
// that a partition cut off stays silent until gRPC's keepalive gives up (7 s).
inline constexpr milliseconds kLeaderRecheck{500};
// The leader controller's lease. It bounds how long a dead controller leads, so how long the
// job goes without one; and it must outlast etcd's own election when the member that led Raft
// is lost (1-2 election timeouts, more on a loaded machine), since a leader that cannot
// refresh its lease by then must step down. At 2 s the lease lapsed in every few slot losses
// in the tests, handing the job to another controller for nothing; 5 s leaves the refresh
// 3.3 s at worst.
inline constexpr milliseconds kControllerLease{5000};
// The etcd members keel starts: Raft's heartbeat and election timeout.
inline constexpr milliseconds kEtcdHeartbeat{100};
inline constexpr milliseconds kEtcdElectionTimeout{1000};
// The control plane's transport (ZeroMQ): a client reconnects this often, no backoff; a
// connection whose peer sent nothing for the ZMTP timeout is closed.
inline constexpr milliseconds kReconnectEvery{50};
inline constexpr milliseconds kZmtpHeartbeatEvery{500};
inline constexpr milliseconds kZmtpTimeout{1500};
// When an agent's connection closes, its liveness port is tried: answered (a reset link), the
// slot has this long to reconnect and heartbeat; unanswered, this shorter grace (a live agent
// reconnects within kReconnectEvery and heartbeats within its poll).
inline constexpr milliseconds kAnsweredGrace{1000};
inline constexpr milliseconds kReopenGrace{150};
// A close after this much silence is the ZMTP timeout's, not the agent's: judged by
// detect.slot_timeout_ms alone.
inline constexpr milliseconds kSilentBeforeClose{1000};

// The inequalities between the table and the job's detect.* settings that do not hold, each
// one line naming both sides, their values and why it matters; empty when all hold.
// `with_etcd`: the job has a leader in etcd that can fail over (3+ slots or --etcd).
std::vector<std::string> check_timings(const config::DetectConfig& d, bool with_etcd);

}  // namespace keel::timings
