#include "launcher/controller/job_etcd.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "launcher/controller/agent_host.h"
#include "launcher/etcd/etcd_store.h"
#include "proto/store_keys.h"
#include "robust/etcd_member_place.h"
#include "runtime/check.h"
#include "runtime/text.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

// How long the agents get to start their members' processes (a fork and an exec each).
constexpr std::chrono::milliseconds kMemberStartWait{10000};
// Every etcd call's deadline, and how often a new cluster is asked whether it has a leader.
constexpr std::chrono::milliseconds kCallTimeout{2000};
constexpr std::chrono::milliseconds kHealthPoll{50};
// How long the user's own cluster (--etcd) gets to answer at the start.
constexpr std::chrono::milliseconds kUserClusterWait{10000};

}  // namespace

JobEtcd start_job_etcd(AgentHost& agents, const JobEtcdOptions& o,
                       std::function<void(const std::string&, const EventFields&)> on_event) {
  JobEtcd j;
  if (o.endpoints.empty() && o.slots < 3) return j;
  const auto start = Clock::now();
  std::vector<std::string> endpoints;
  std::vector<int> member_slots;
  std::string where;
  if (!o.endpoints.empty()) {
    endpoints = split(o.endpoints, ',', /*skip_empty=*/true);
    where = "the cluster at " + o.endpoints;
  } else {
    member_slots =
        place_etcd_members(etcd_member_count(o.slots, o.members), agents.failure_domains());
    endpoints = agents.start_etcd_members(member_slots, o.data_root, o.log_dir, kMemberStartWait);
    std::vector<std::string> at;
    for (int k : member_slots) at.push_back(std::to_string(k));
    where = detail::concat(member_slots.size(), " members on slots ", join(at, ','), " (",
                           join(endpoints, ','), "; a quorum survives ",
                           etcd_members_survive(int(member_slots.size())), ")");
  }
  j.client = std::make_unique<EtcdClient>(endpoints, kCallTimeout);
  // A new cluster takes its first Raft election (seconds: members start apart and wait out an
  // election timeout) before it takes a write; a lease granted before it would lapse unused.
  // The user's cluster runs already: one that does not answer within seconds is a wrong
  // address, said now rather than after the quorum timeout.
  const std::chrono::milliseconds wait =
      o.endpoints.empty() ? o.quorum_timeout : std::min(o.quorum_timeout, kUserClusterWait);
  const auto deadline = start + wait;
  while (true) {
    if (o.stop && *o.stop)
      throw Error(detail::concat("stopped by a signal while waiting for etcd (", where, ")"));
    try {
      if (j.client->status().leader_id != 0) break;
    } catch (const EtcdUnavailable& e) {
      if (Clock::now() > deadline)
        throw QuorumLost(detail::concat(
            "etcd (", where, ") ", o.endpoints.empty() ? "elected no leader" : "did not answer",
            " within ", wait.count(), " ms",
            o.endpoints.empty() ? " (detect.quorum_timeout_ms)" : " (--etcd)", ": ", e.what()));
    }
    agents.keep_alive();
    std::this_thread::sleep_for(kHealthPoll);
  }
  j.state = std::make_unique<EtcdControlState>(j.client.get(), o.spec.job(), o.leader,
                                               kControllerLeaseTtl, o.quorum_timeout,
                                               [&agents] { agents.keep_alive(); });
  // The ranks' store lives in etcd too: it outlives any controller (a new leader and every
  // rank find the same keys).
  j.store_addr = etcd_store_address(endpoints, keys::state::store_prefix(o.spec.job()));
  state::JobSpec spec = o.spec;
  spec.set_store_addr(j.store_addr);
  j.state->spec(spec);
  // Beside every member (or the first slots, for the user's cluster), as many as a quorum
  // of members: one of them is left whichever machine dies.
  j.candidates = std::min(o.slots, int(o.endpoints.empty() ? endpoints.size() : 3));
  if (o.endpoints.empty()) {
    const state::EtcdMembers first =
        EtcdUpkeep::first(agents, member_slots, o.data_root, o.log_dir);
    j.state->etcd_members(first);
    j.upkeep = std::make_unique<EtcdUpkeep>(
        &agents, j.client.get(), first,
        [state = j.state.get()](const state::EtcdMembers& m) { state->etcd_members(m); },
        std::move(on_event), o.leader.slot());
    j.state->give_up_when([u = j.upkeep.get()] { u->check_quorum(); });
  }
  char took[32];
  std::snprintf(took, sizeof(took), "%.2f s",
                std::chrono::duration<double>(Clock::now() - start).count());
  j.summary = "etcd: " + where + ", up and led in " + took;
  return j;
}

}  // namespace keel
