#include "launcher/controller/etcd_upkeep.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "launcher/controller/agent_host.h"
#include "launcher/patient_store.h"
#include "parallel/socket_util.h"
#include "parallel/tcp_store.h"
#include "robust/etcd_member_place.h"
#include "robust/raft_leader_place.h"
#include "runtime/logging.h"
#include "runtime/text.h"

namespace keel {
namespace {

// How long the new member's agent gets to start its process, and how often etcd is asked,
// once it runs, whether every member has started.
constexpr std::chrono::milliseconds kStartWait{5000};
constexpr std::chrono::milliseconds kWholeCheckEvery{200};

// How long a member cut off from the others (its slot silent, not dead) is left in the
// cluster before it is removed. etcd 3.4's leader removes a peer by stopping its streams on
// its own loop, and a stream to a cut-off peer whose socket buffer is full (every
// linearizable read sends a heartbeat to every member) blocks until rafthttp's 5 s write
// timeout: the leader sends no heartbeat meanwhile, the other member starts an election, and
// the cluster is without quorum for 10 s or more (seen: the job's controller lost its lease).
// Once that timeout has fired the stream stays closed (a cut-off peer cannot dial back in),
// and the removal is instant. A member whose process died closed its streams: no wait.
constexpr std::chrono::milliseconds kCutOffMemberGrace{10000};
// How long the probe of a silent member's port may take (refused: its process is gone), and
// how often it is made: a cut-off member's probe times out on the controller's loop.
constexpr std::chrono::milliseconds kProbe{100};
constexpr std::chrono::milliseconds kProbeEvery{2000};
// The Raft leader's place: looked at every few seconds, once the members have been as they
// are for a while (a member added to replace a lost one is caught up by then, or its Status
// says it is not). The Status calls' deadline bounds a check on the controller's loop; the
// move itself takes one round trip and one vote when its target is caught up.
constexpr std::chrono::milliseconds kLeaderCheckEvery{5000};
constexpr std::chrono::milliseconds kMembersSettled{10000};
constexpr std::chrono::milliseconds kStatusDeadline{200};
constexpr std::chrono::milliseconds kMoveDeadline{1000};
// How often check_quorum probes the lost members' ports while the controller waits for etcd.
constexpr std::chrono::milliseconds kQuorumCheckEvery{500};
// After a move that failed: the next try waits longer (whatever refused it may last).
constexpr std::chrono::milliseconds kAfterFailedMove{30000};

// Whether the member at `peer_url` ("https://host:port") is gone while its host is up (its
// port refuses a connection): it closed its streams, so removing it cannot stall etcd.
bool member_process_gone(const std::string& peer_url) {
  const size_t scheme = peer_url.find("://");
  const std::string addr = scheme == std::string::npos ? peer_url : peer_url.substr(scheme + 3);
  try {
    const auto [host, port] = parse_host_port(addr);
    return detail::connection_refused(host, port, std::chrono::steady_clock::now() + kProbe);
  } catch (const std::exception&) {
    return false;
  }
}

// Whether etcd's member `m` is the one at `peer_url`.
bool serves(const EtcdMemberInfo& m, const std::string& peer_url) {
  return std::find(m.peer_urls.begin(), m.peer_urls.end(), peer_url) != m.peer_urls.end();
}

}  // namespace

EtcdUpkeep::EtcdUpkeep(AgentHost* agents, EtcdClient* client, state::EtcdMembers members,
                       std::function<void(const state::EtcdMembers&)> record,
                       std::function<void(const std::string&, const EventFields&)> on_event,
                       int controller_slot)
    : agents_(agents),
      client_(client),
      members_(std::move(members)),
      record_(std::move(record)),
      on_event_(std::move(on_event)),
      controller_slot_(controller_slot),
      changed_at_(std::chrono::steady_clock::now()) {}

state::EtcdMembers EtcdUpkeep::first(const AgentHost& agents, const std::vector<int>& slots,
                                     const std::string& data_root, const std::string& log_dir) {
  state::EtcdMembers m;
  m.set_data_root(data_root);
  m.set_log_dir(log_dir);
  for (int k : slots) {
    auto* x = m.add_members();
    x->set_slot(k);
    x->set_name("slot" + std::to_string(k));
    x->set_peer_url(agents.etcd_peer_url(k));
  }
  return m;
}

bool EtcdUpkeep::orphaned(const state::EtcdMembers::Member& m) const {
  return m.slot() < agents_->slot_count() && agents_->slot_up(m.slot()) &&
         agents_->etcd_peer_url(m.slot()) != m.peer_url();
}

const state::EtcdMembers::Member* EtcdUpkeep::on(int slot) const {
  for (const auto& m : members_.members())
    if (m.slot() == slot) return &m;
  return nullptr;
}

void EtcdUpkeep::keep_raft_leader_home() {
  const auto now = std::chrono::steady_clock::now();
  if (now - changed_at_ < kMembersSettled || now - leader_checked_at_ < kLeaderCheckEvery) return;
  leader_checked_at_ = now;
  std::vector<RaftMemberView> view;
  for (const auto& m : members_.members()) {
    RaftMemberView v;
    v.slot = m.slot();
    v.slot_up = m.slot() < agents_->slot_count() && agents_->slot_up(m.slot());
    view.push_back(v);
  }
  // Nothing is asked of a cluster with a member's machine away: no move then anyway.
  if (std::any_of(view.begin(), view.end(), [](const auto& v) { return !v.slot_up; })) return;
  EtcdStatus leader;
  try {
    const std::vector<EtcdMemberInfo> listed = client_->member_list();
    const std::vector<EtcdStatus> statuses = client_->member_statuses(now + kStatusDeadline);
    for (size_t i = 0; i < view.size(); ++i) {
      for (const auto& l : listed)
        if (serves(l, members_.members(int(i)).peer_url())) view[i].id = l.id;
      for (const auto& st : statuses)
        if (view[i].id != 0 && st.member_id == view[i].id) {
          view[i].answered = true;
          view[i].leader_id = st.leader_id;
          view[i].raft_term = st.raft_term;
          view[i].raft_index = st.raft_index;
          if (st.member_id == st.leader_id) leader = st;
        }
    }
  } catch (const Error& e) {
    leader_stays_because_ = std::string("etcd did not answer: ") + e.what();
    return;
  }
  const RaftLeaderMove move = raft_leader_move(view, controller_slot_);
  if (move.to == 0) {
    if (move.why_not != leader_stays_because_ && move.why_not != "in place")
      LOG(INFO) << "etcd: the Raft leader stays where it is: " << move.why_not;
    leader_stays_because_ = move.why_not;
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    client_->move_leader(leader, move.to, start + kMoveDeadline);
  } catch (const Error& e) {
    LOG(WARNING) << "etcd: moving the Raft leader to slot " << move.to_slot << ": " << e.what();
    leader_checked_at_ = std::chrono::steady_clock::now() + kAfterFailedMove - kLeaderCheckEvery;
    return;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  LOG(INFO) << "etcd: Raft leadership moved to the member on slot " << move.to_slot << " in "
            << std::lround(ms) << " ms (the controller is on slot " << controller_slot_ << ")";
  leader_stays_because_.clear();
  if (on_event_)
    on_event_("etcd_leader_moved", EventFields().add("slot", move.to_slot).add("took_ms", ms));
}

void EtcdUpkeep::check_quorum() {
  const auto now = std::chrono::steady_clock::now();
  if (now - quorum_checked_at_ < kQuorumCheckEvery) return;
  quorum_checked_at_ = now;
  std::vector<std::string> gone;
  for (const auto& m : members_.members()) {
    const int k = m.slot();
    const bool dead = k < agents_->slot_count() && (agents_->agent_gone(k) || orphaned(m)) &&
                      member_process_gone(m.peer_url());
    if (dead) gone.push_back(m.name() + " (slot " + std::to_string(k) + ")");
  }
  const int n = members_.members_size();
  const int left = n - int(gone.size());
  if (left > n / 2) return;
  throw QuorumLost(detail::concat(
      "the job's etcd lost its quorum for good: member(s) ", join(gone, ", "),
      " are gone with their machines (their agents' connections closed, their ports refuse), ",
      left, " of ", n,
      " left, and no write can be made without a majority; the job cannot go "
      "on. Start it again from its newest persistent checkpoint: keel-launch --resume ",
      // The members' logs are in the run directory's logs/.
      std::filesystem::path(members_.log_dir()).parent_path().string()));
}

void EtcdUpkeep::follow_start() {
  const auto now = std::chrono::steady_clock::now();
  const std::optional<std::string> answer = agents_->etcd_member_started(starting_->slot);
  if (!answer) {
    if (now - starting_->sent_at < kStartWait) return;
    // The agent is gone or silent: its slot is lost soon, and the member with it replaced.
    LOG(WARNING) << "etcd member " << starting_->name << " on slot " << starting_->slot
                 << ": its agent did not answer within " << kStartWait.count() << " ms";
    starting_.reset();
    return;
  }
  if (!answer->empty()) {
    LOG(WARNING) << "etcd member " << starting_->name << " on slot " << starting_->slot << ": "
                 << *answer;
    starting_.reset();
    return;
  }
  if (now - starting_->checked_at < kWholeCheckEvery) return;
  starting_->checked_at = now;
  try {
    // etcd names a member once it has started and joined.
    for (const auto& m : client_->member_list())
      if (m.name.empty()) return;
  } catch (const Error&) {
    return;  // asked again at a later call
  }
  const double ms = std::chrono::duration<double, std::milli>(now - starting_->changed_at).count();
  LOG(WARNING) << "etcd is whole again: member " << starting_->name << " on slot "
               << starting_->slot << " runs, " << std::lround(ms) << " ms after the change";
  // This controller's client (whose members the processes it starts are given) follows now.
  client_->look_at_members();
  if (on_event_)
    on_event_("etcd_whole", EventFields()
                                .add("added", starting_->name)
                                .add("slot", starting_->slot)
                                .add("members", members_.members_size())
                                .add("after_ms", ms));
  starting_.reset();
}

void EtcdUpkeep::maintain() {
  keep_raft_leader_home();
  if (starting_) {
    follow_start();
    return;  // one change at a time
  }
  int lost = -1;
  for (const auto& m : members_.members())
    if (m.slot() < agents_->slot_count() && (agents_->slot_lost(m.slot()) || orphaned(m)))
      lost = m.slot();
  if (lost < 0) return;
  std::vector<int> free_slots, kept;
  for (int k = 0; k < agents_->slot_count(); ++k)
    if (agents_->slot_up(k) && (!on(k) || k == lost)) free_slots.push_back(k);
  for (const auto& m : members_.members())
    if (m.slot() != lost) kept.push_back(m.slot());
  const int to = etcd_replacement_slot(free_slots, kept, agents_->failure_domains());
  if (to < 0) return;  // no live slot without a member: wait for one
  const state::EtcdMembers::Member old = *on(lost);
  const char* why = orphaned(old) ? "its slot came back without it" : "its slot was lost";
  const auto now = std::chrono::steady_clock::now();
  const auto silent_since = agents_->lost_silent_since(lost);
  if (silent_since && now - *silent_since < kCutOffMemberGrace) {
    if (now - probed_at_ < kProbeEvery) return;
    probed_at_ = now;
    if (!member_process_gone(old.peer_url())) return;
  }
  state::EtcdMembers::Member next;
  next.set_slot(to);
  next.set_name("slot" + std::to_string(to) + "-" + std::to_string(members_.replaced() + 1));
  next.set_peer_url(agents_->etcd_peer_url(to));
  state::EtcdMembers after = members_;  // as it will be once the change is made
  after.set_replaced(members_.replaced() + 1);
  for (auto& m : *after.mutable_members())
    if (m.slot() == lost) m = next;
  try {
    std::vector<uint64_t> lost_ids;  // the lost member, as etcd lists it (if it still does)
    bool others_started = true;
    for (const auto& m : client_->member_list()) {
      if (serves(m, old.peer_url())) {
        lost_ids.push_back(m.id);
        continue;
      }
      const bool ours = std::any_of(members_.members().begin(), members_.members().end(),
                                    [&](const auto& x) { return serves(m, x.peer_url()); });
      // An add whose answer was lost (the member it went through died) took effect all the
      // same: a member keel never started, which would count against the quorum forever.
      if (m.name.empty() && !ours) {
        client_->member_remove(m.id);
        continue;
      }
      // etcd names a member once it runs.
      others_started = others_started && !m.name.empty();
    }
    // One change at a time: every other member must have started before the next, or two
    // members short would cost the quorum.
    if (!others_started) return;
    for (uint64_t id : lost_ids) client_->member_remove(id);
    uint64_t id = 0;
    const auto listed = client_->member_add(next.peer_url(), &id);
    // Its --initial-cluster: every member under the name keel gave it.
    std::string cluster;
    for (const auto& m : listed)
      for (const auto& url : m.peer_urls) {
        std::string name = m.name;
        for (const auto& mine : after.members())
          if (mine.peer_url() == url) name = mine.name();
        cluster += (cluster.empty() ? "" : ",") + name + "=" + url;
      }
    members_ = after;
    changed_at_ = std::chrono::steady_clock::now();
    agents_->send_etcd_member_start(to, next.name(), cluster, members_.data_root(),
                                    members_.log_dir());
    starting_ = Starting{.slot = to,
                         .name = next.name(),
                         .sent_at = changed_at_,
                         .changed_at = changed_at_,
                         .checked_at = {}};
  } catch (const std::exception& e) {
    // Tried again at a later call from what etcd lists then: a member removed stays removed,
    // one added but not started is the lost one of its slot next time.
    LOG(WARNING) << "etcd: replacing member " << old.name() << " of lost slot " << lost << ": "
                 << e.what();
    return;
  }
  LOG(WARNING) << "etcd member " << old.name() << " (slot " << lost << ": " << why
               << ") replaced by " << next.name() << " on slot " << to;
  // Outside the try: a leader deposed meanwhile must learn it (Deposed), not log it.
  if (record_) record_(members_);
  // How long the controller's loop was held by the change (etcd's calls; the start is
  // followed by later calls).
  const double held_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - now).count();
  if (on_event_)
    on_event_("etcd_member", EventFields()
                                 .add("removed", old.name())
                                 .add("added", next.name())
                                 .add("slot", to)
                                 .add("lost_slot", lost)
                                 .add("why", why)
                                 .add("endpoint", agents_->etcd_client_url(to))
                                 .add("held_ms", held_ms));
}

}  // namespace keel
