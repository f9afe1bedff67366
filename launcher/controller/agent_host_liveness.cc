// How the agents' host knows that a slot is lost (DESIGN.md, Failure handling): its agent's
// connection closed and did not reopen (its processes died), its heartbeats stopped (a
// partition, a power loss), or it did not register with a leader that took the job over.
#include <chrono>

#include "launcher/control_plane.h"
#include "launcher/controller/agent_host.h"
#include "launcher/timings.h"
#include "parallel/socket_util.h"
#include "runtime/logging.h"
#include "runtime/text.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// When an agent's connection closes, its liveness port is tried (Register.liveness_port):
// refused, its process is gone and the slot is lost at once; listening, it lives and its link
// merely reset: it reconnects and heartbeats at once, within kAnsweredGrace or it is lost (a
// port that answered for a process that then never came back was seen once in 30 trials;
// the heartbeat timeout would have taken 2 s). The try waits kProbeWait at most: a host that
// answers nothing (it went down in the same instant) leaves kReopenGrace to decide.
constexpr std::chrono::milliseconds kProbeWait{50};
constexpr std::chrono::milliseconds kAnsweredGrace = timings::kAnsweredGrace;
// A port that answered is tried again this often for this long: a killed process closes its
// sockets one by one as it exits, and on a loaded machine its control connection's close can
// be seen while its listener is still open (the 06-standby check once waited out the whole
// kAnsweredGrace so). Refused on a later try: the process is gone after all.
constexpr std::chrono::milliseconds kReprobeEvery{10};
constexpr std::chrono::milliseconds kReprobeFor{250};
// A slot whose agent's connection closed and whose probe was not answered is lost once it
// has not reconnected for this long: a live agent whose connection merely reset reconnects
// within 50 ms (the client's reconnect interval, launcher/control_plane.cc) and heartbeats as
// soon as the handshake succeeds, within its 20 ms poll (launcher/agent/agent.cc); a dead one
// never does.
constexpr std::chrono::milliseconds kReopenGrace = timings::kReopenGrace;
// A close that follows this much silence is the ZMTP heartbeat timeout's (1.5 s), not the
// agent's own: a silent slot is judged by detect.slot_timeout_ms alone.
constexpr std::chrono::milliseconds kSilentBeforeClose = timings::kSilentBeforeClose;

// What the liveness port `port` of the agent on `host` says (kSilent without a port to try).
detail::PortProbe probe(const std::string& host, int port) {
  if (port <= 0) return detail::PortProbe::kSilent;
  try {
    return detail::probe_port(host, port, Clock::now() + kProbeWait);
  } catch (const std::exception&) {
    return detail::PortProbe::kSilent;  // a host that does not resolve: let the grace decide
  }
}

}  // namespace

int AgentHost::await_rejoin(std::chrono::milliseconds timeout) {
  wait_until(
      [&] {
        for (int k = 0; k < members_->slot_count(); ++k)
          if (members_->link(k) == JobMembership::Link::kPending) return false;
        return true;
      },
      timeout);
  int lost = 0;
  for (int k = 0; k < members_->slot_count(); ++k) {
    if (members_->link(k) != JobMembership::Link::kPending) continue;
    ++lost;
    members_->rejoin_slot(k);  // pending -> up -> lost: the usual loss of a slot
    members_->heartbeat_lost(k);
    // Dead or cut off, this leader cannot tell: silent since the takeover began at least.
    Agent& a = agents_[size_t(k)];
    a.lost_silent = true;
    a.last_heartbeat = Clock::now() - timeout;
    for (int r : ranks_on(k)) {
      RankExit x;
      x.rank = r;
      x.slot = k;
      x.slot_lost = true;
      x.lost_by = "heartbeat";
      x.detail = detail::concat("slot ", k, "'s agent did not register with the new leader within ",
                                timeout.count(), " ms");
      exits_.push_back(x);
    }
  }
  return lost;
}

void AgentHost::note_closed() {
  // A dead agent's kernel closed its connection: the slot is lost at once (after a grace
  // to reconnect), not at the heartbeat timeout, which stays for slots gone silent. Noted
  // whenever the plane is polled (keep_alive too: a controller waiting on etcd learns that a
  // member's machine died), judged by check_heartbeats.
  const auto now = Clock::now();
  for (const std::string& id : server_->take_closed())
    for (Agent& a : agents_) {
      if (a.identity != id) continue;
      const detail::PortProbe p = probe(a.host, a.liveness_port);
      // A close after a silence is the ZMTP heartbeat timeout's (a cut-off machine), left to
      // the slot timeout; but a refused port says the process is gone however long this
      // controller was away (blocked on etcd, its heartbeats unread).
      if (p != detail::PortProbe::kRefused && now - a.last_heartbeat >= kSilentBeforeClose)
        continue;
      if (p == detail::PortProbe::kListening)
        LOG(INFO) << "the connection of " << a.identity << " closed, but its liveness port "
                  << a.liveness_port << " answers: a reset link, the slot kept if it reconnects";
      a.process_gone = p == detail::PortProbe::kRefused;
      a.closed_at = now;
      a.close_grace = a.process_gone                       ? std::chrono::milliseconds(0)
                      : p == detail::PortProbe::kListening ? kAnsweredGrace
                                                           : kReopenGrace;
    }
}

bool AgentHost::agent_gone(int slot) const {
  const Agent& a = agents_.at(size_t(slot));
  return (slot_lost(slot) && !a.lost_silent) || (a.closed_at && a.process_gone);
}

void AgentHost::check_heartbeats() {
  const auto now = Clock::now();
  note_closed();
  for (int k = 0; k < int(agents_.size()); ++k) {
    Agent& a = agents_[size_t(k)];
    if (a.closed_at && a.close_grace == kAnsweredGrace && now - *a.closed_at < kReprobeFor &&
        now - a.reprobed_at >= kReprobeEvery) {
      a.reprobed_at = now;
      if (probe(a.host, a.liveness_port) == detail::PortProbe::kRefused) {
        LOG(INFO) << "the liveness port " << a.liveness_port << " of " << a.identity
                  << " refuses now: its process is gone";
        a.process_gone = true;
        a.close_grace = std::chrono::milliseconds(0);
      }
    }
    const bool closed = a.closed_at && now - *a.closed_at >= a.close_grace;
    if (!up(k) || (now - a.last_heartbeat < slot_timeout_ && !closed)) continue;
    members_->heartbeat_lost(k);
    const double silent = std::chrono::duration<double>(now - a.last_heartbeat).count();
    const double since_close =
        closed ? std::chrono::duration<double>(now - *a.closed_at).count() : 0;
    a.closed_at.reset();
    a.lost_silent = !closed;
    for (int r : ranks_on(k)) {
      if (!alive_[size_t(r)] && !killing_.count(r)) continue;
      alive_[size_t(r)] = false;
      killing_.erase(r);
      RankExit x;
      x.rank = r;
      x.slot = k;
      x.slot_lost = true;
      x.lost_by = closed ? "connection_closed" : "heartbeat";
      x.detail = closed && a.process_gone
                     ? detail::concat("the connection from ", a.host,
                                      " closed and its agent's process is gone (its liveness port ",
                                      a.liveness_port, " refused a connection)")
                 : closed ? detail::concat("the connection from ", a.host, " closed ",
                                           int(since_close * 1000), " ms ago and did not reopen")
                          : detail::concat("no heartbeat from ", a.host, " for ",
                                           int(silent * 1000), " ms");
      exits_.push_back(x);
    }
  }
}

std::optional<std::chrono::steady_clock::time_point> AgentHost::lost_silent_since(int slot) const {
  const Agent& a = agents_.at(size_t(slot));
  if (!slot_lost(slot) || !a.lost_silent) return std::nullopt;
  return a.last_heartbeat;
}

std::optional<RankExit> AgentHost::poll_exit() {
  check_heartbeats();
  if (exits_.empty()) return std::nullopt;
  RankExit x = exits_.front();
  exits_.pop_front();
  return x;
}

double AgentHost::slot_silence_s(int slot) const {
  return std::chrono::duration<double>(Clock::now() - agents_[size_t(slot)].last_heartbeat).count();
}

}  // namespace keel
