#include "launcher/controller/etcd_upkeep.h"

#include "launcher/controller/agent_host.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// How long the new member's agent gets to start its process.
constexpr std::chrono::milliseconds kStartWait{5000};

// The --initial-cluster value from etcd's own list after an add (the new member has no name
// yet: it is given `name`).
std::string cluster_of(const std::vector<EtcdMemberInfo>& members, uint64_t id,
                       const std::string& name) {
  std::string out;
  for (const auto& m : members)
    for (const auto& url : m.peer_urls)
      out += (out.empty() ? "" : ",") + (m.id == id ? name : m.name) + "=" + url;
  return out;
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
  for (int k = 0; k < members; ++k) names_[k] = "slot" + std::to_string(k);
}

void EtcdUpkeep::maintain() {
  int lost = -1;
  for (const auto& [slot, name] : names_)
    if (agents_->slot_lost(slot)) lost = slot;
  if (lost < 0) return;
  int to = -1;
  for (int k = 0; k < agents_->slot_count() && to < 0; ++k)
    if (agents_->slot_up(k) && !names_.count(k)) to = k;
  if (to < 0) return;  // no live slot without a member: wait for one
  const std::string old_name = names_.at(lost);
  const std::string name = "slot" + std::to_string(to) + "-" + std::to_string(replaced_ + 1);
  try {
    for (const auto& m : client_->member_list())
      if (m.name == old_name) client_->member_remove(m.id);
    names_.erase(lost);
    uint64_t id = 0;
    const auto members = client_->member_add(agents_->etcd_peer_url(to), &id);
    agents_->start_etcd_member(to, name, cluster_of(members, id, name), data_root_, log_dir_,
                               kStartWait);
    names_[to] = name;
    ++replaced_;
    LOG(WARNING) << "etcd member " << old_name << " (slot " << lost << ", lost) replaced by "
                 << name << " on slot " << to;
    if (on_event_)
      on_event_("etcd_member", EventFields()
                                   .add("removed", old_name)
                                   .add("added", name)
                                   .add("slot", to)
                                   .add("lost_slot", lost));
  } catch (const std::exception& e) {
    // Tried again at the next call; the loss stays recorded until a change succeeds.
    LOG(WARNING) << "etcd: replacing member " << old_name << " of lost slot " << lost << ": "
                 << e.what();
    if (!names_.count(lost) && !names_.count(to)) names_[lost] = old_name;
  }
}

}  // namespace keel
