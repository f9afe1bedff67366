#include "launcher/controller/etcd_upkeep.h"

#include <algorithm>

#include "launcher/controller/agent_host.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// How long the new member's agent gets to start its process.
constexpr std::chrono::milliseconds kStartWait{5000};

// Whether etcd's member `m` is the one at `peer_url`.
bool serves(const EtcdMemberInfo& m, const std::string& peer_url) {
  return std::find(m.peer_urls.begin(), m.peer_urls.end(), peer_url) != m.peer_urls.end();
}

}  // namespace

EtcdUpkeep::EtcdUpkeep(AgentHost* agents, EtcdClient* client, int members, std::string data_root,
                       std::string log_dir,
                       std::function<void(const std::string&, const EventFields&)> on_event)
    : agents_(agents),
      client_(client),
      data_root_(std::move(data_root)),
      log_dir_(std::move(log_dir)),
      on_event_(std::move(on_event)) {
  for (int k = 0; k < members; ++k)
    members_[k] = Member{"slot" + std::to_string(k), agents_->etcd_peer_url(k)};
}

void EtcdUpkeep::maintain() {
  int lost = -1;
  for (const auto& [slot, m] : members_)
    if (agents_->slot_lost(slot)) lost = slot;
  if (lost < 0) return;
  int to = -1;
  for (int k = 0; k < agents_->slot_count() && to < 0; ++k)
    if (agents_->slot_up(k) && !members_.count(k)) to = k;
  if (to < 0) return;  // no live slot without a member: wait for one
  const Member old = members_.at(lost);
  const Member next{"slot" + std::to_string(to) + "-" + std::to_string(replaced_ + 1),
                    agents_->etcd_peer_url(to)};
  try {
    std::vector<uint64_t> lost_ids;  // the lost member, as etcd lists it (if it still does)
    bool others_started = true;
    for (const auto& m : client_->member_list()) {
      if (serves(m, old.peer_url)) {
        lost_ids.push_back(m.id);
        continue;
      }
      const bool ours = std::any_of(members_.begin(), members_.end(),
                                    [&](const auto& s) { return serves(m, s.second.peer_url); });
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
    members_.erase(lost);
    uint64_t id = 0;
    const auto after = client_->member_add(next.peer_url, &id);
    members_[to] = next;
    // Its --initial-cluster: every member under the name keel gave it.
    std::string cluster;
    for (const auto& m : after)
      for (const auto& url : m.peer_urls) {
        std::string name = m.name;
        for (const auto& [slot, mine] : members_)
          if (mine.peer_url == url) name = mine.name;
        cluster += (cluster.empty() ? "" : ",") + name + "=" + url;
      }
    agents_->start_etcd_member(to, next.name, cluster, data_root_, log_dir_, kStartWait);
    ++replaced_;
    LOG(WARNING) << "etcd member " << old.name << " (slot " << lost << ", lost) replaced by "
                 << next.name << " on slot " << to;
    if (on_event_)
      on_event_("etcd_member", EventFields()
                                   .add("removed", old.name)
                                   .add("added", next.name)
                                   .add("slot", to)
                                   .add("lost_slot", lost));
  } catch (const std::exception& e) {
    // Tried again at a later call from what etcd lists then: a member removed stays removed,
    // one added but not started is the lost one of its slot next time.
    LOG(WARNING) << "etcd: replacing member " << old.name << " of lost slot " << lost << ": "
                 << e.what();
    if (!members_.count(lost) && !members_.count(to)) members_[lost] = old;
  }
}

}  // namespace keel
