// AgentHost::start_etcd_members: the job's etcd cluster, one member beside each of the slots
// robust/etcd_member_place.h chooses (DESIGN.md, Processes), started by their agents on the
// ports they registered.
#include <chrono>

#include "launcher/control_plane.h"
#include "launcher/controller/agent_host.h"
#include "launcher/etcd/etcd_client.h"
#include "launcher/etcd/etcd_members.h"
#include "runtime/check.h"

namespace keel {

control::Envelope AgentHost::etcd_start(const std::string& name, const std::string& cluster,
                                        const std::string& data_root, const std::string& log_dir,
                                        bool existing) const {
  control::Envelope m = command(control::Command::etcd_start);
  control::EtcdMemberStart* e = m.mutable_command()->mutable_etcd();
  e->set_name(name);
  e->set_cluster(cluster);
  e->set_data_dir(data_root + "/" + name);
  e->set_log_path(log_dir + "/etcd-" + name + ".log");
  e->set_existing(existing);
  return m;
}

std::vector<std::string> AgentHost::start_etcd_members(const std::vector<int>& slots,
                                                       const std::string& data_root,
                                                       const std::string& log_dir,
                                                       std::chrono::milliseconds timeout) {
  KEEL_CHECK(!slots.empty() && slots.size() <= agents_.size(), "etcd members: ", slots.size(),
             " of ", agents_.size(), " slots");
  std::vector<EtcdMemberSpec> specs(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    KEEL_CHECK(slots[i] >= 0 && size_t(slots[i]) < agents_.size(), "etcd member on slot ", slots[i],
               " of ", agents_.size());
    const Agent& a = agents_[size_t(slots[i])];
    EtcdMemberSpec& s = specs[i];
    s.name = "slot" + std::to_string(slots[i]);
    s.host = a.host;
    s.client_port = a.etcd_client_port;
    s.peer_port = a.etcd_peer_port;
  }
  const std::string cluster = etcd_cluster(specs);
  etcd_replies_.clear();
  std::vector<std::string> endpoints;
  for (size_t i = 0; i < slots.size(); ++i) {
    send(slots[i], etcd_start(specs[i].name, cluster, data_root, log_dir, /*existing=*/false));
    endpoints.push_back(kEtcdTlsScheme + specs[i].host + ":" +
                        std::to_string(specs[i].client_port));
  }
  wait_until([&] { return etcd_replies_.size() == slots.size(); }, timeout);
  for (int k : slots) check_etcd_reply(k, timeout);
  return endpoints;
}

std::vector<std::string> AgentHost::failure_domains() const {
  std::vector<std::string> d;
  for (const Agent& a : agents_) d.push_back(a.failure_domain);
  return d;
}

void AgentHost::check_etcd_reply(int slot, std::chrono::milliseconds timeout) const {
  auto it = etcd_replies_.find(slot);
  if (it == etcd_replies_.end())
    throw Error(detail::concat("etcd member on slot ", slot, ": its agent did not answer within ",
                               timeout.count(), " ms"));
  if (!it->second.message().empty())
    throw Error(detail::concat("etcd member on slot ", slot, ": ", it->second.message()));
}

void AgentHost::send_etcd_member_start(int slot, const std::string& name,
                                       const std::string& cluster, const std::string& data_root,
                                       const std::string& log_dir) {
  etcd_replies_.erase(slot);
  send(slot, etcd_start(name, cluster, data_root, log_dir, /*existing=*/true));
}

std::optional<std::string> AgentHost::etcd_member_started(int slot) const {
  auto it = etcd_replies_.find(slot);
  if (it == etcd_replies_.end()) return std::nullopt;
  return it->second.message();
}

std::string AgentHost::etcd_peer_url(int slot) const {
  const Agent& a = agents_[size_t(slot)];
  return kEtcdTlsScheme + a.host + ":" + std::to_string(a.etcd_peer_port);
}

std::string AgentHost::etcd_client_url(int slot) const {
  const Agent& a = agents_[size_t(slot)];
  return kEtcdTlsScheme + a.host + ":" + std::to_string(a.etcd_client_port);
}

}  // namespace keel
