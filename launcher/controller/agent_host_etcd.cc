// AgentHost::start_etcd_members: the job's etcd cluster, one member beside each of the first
// slots (DESIGN.md, Processes), started by their agents on the ports they registered.
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

std::vector<std::string> AgentHost::start_etcd_members(int n, const std::string& data_root,
                                                       const std::string& log_dir,
                                                       std::chrono::milliseconds timeout) {
  KEEL_CHECK(n >= 1 && n <= int(agents_.size()), "etcd members: ", n, " of ", agents_.size(),
             " slots");
  std::vector<EtcdMemberSpec> specs(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    const Agent& a = agents_[size_t(k)];
    EtcdMemberSpec& s = specs[size_t(k)];
    s.name = "slot" + std::to_string(k);
    s.host = a.host;
    s.client_port = a.etcd_client_port;
    s.peer_port = a.etcd_peer_port;
  }
  const std::string cluster = etcd_cluster(specs);
  etcd_replies_.clear();
  std::vector<std::string> endpoints;
  for (int k = 0; k < n; ++k) {
    send(k, etcd_start(specs[size_t(k)].name, cluster, data_root, log_dir, /*existing=*/false));
    endpoints.push_back(kEtcdTlsScheme + specs[size_t(k)].host + ":" +
                        std::to_string(specs[size_t(k)].client_port));
  }
  wait_until([&] { return int(etcd_replies_.size()) == n; }, timeout);
  for (int k = 0; k < n; ++k) check_etcd_reply(k, timeout);
  return endpoints;
}

void AgentHost::check_etcd_reply(int slot, std::chrono::milliseconds timeout) const {
  auto it = etcd_replies_.find(slot);
  if (it == etcd_replies_.end())
    throw Error(detail::concat("etcd member on slot ", slot, ": its agent did not answer within ",
                               timeout.count(), " ms"));
  if (!it->second.message().empty())
    throw Error(detail::concat("etcd member on slot ", slot, ": ", it->second.message()));
}

void AgentHost::start_etcd_member(int slot, const std::string& name, const std::string& cluster,
                                  const std::string& data_root, const std::string& log_dir,
                                  std::chrono::milliseconds timeout) {
  etcd_replies_.erase(slot);
  send(slot, etcd_start(name, cluster, data_root, log_dir, /*existing=*/true));
  wait_until([&] { return etcd_replies_.count(slot) > 0; }, timeout);
  check_etcd_reply(slot, timeout);
}

std::string AgentHost::etcd_peer_url(int slot) const {
  const Agent& a = agents_[size_t(slot)];
  return kEtcdTlsScheme + a.host + ":" + std::to_string(a.etcd_peer_port);
}

}  // namespace keel
