#include "parallel/process_groups.h"

#include <algorithm>

#include "parallel/socket_communicator.h"
#ifdef KEEL_HAVE_NCCL
#include "parallel/nccl/nccl_communicator.h"
#endif

namespace keel {
namespace {

std::unique_ptr<Communicator> make_group(const std::vector<int>& members, int rank,
                                         const std::string& name,
                                         const std::shared_ptr<Store>& store,
                                         const ProcessGroupOptions& opts) {
  int group_rank = int(std::find(members.begin(), members.end(), rank) - members.begin());
  KEEL_CHECK(group_rank < int(members.size()), "rank ", rank, " is not in group ", name);
  std::string full = std::to_string(opts.epoch) + "/" + name;
  if (opts.device == DeviceKind::kCuda) {
#ifdef KEEL_HAVE_NCCL
    NcclCommOptions o;
    o.name = full;
    o.rank = group_rank;
    o.size = int(members.size());
    o.device = opts.cuda_device;
    o.timeout = opts.timeout;
    return make_nccl_communicator(store, o);
#else
    throw InputError("runtime.device = cuda, but keel was built without CUDA/NCCL");
#endif
  }
  SocketCommOptions o;
  o.name = full;
  o.rank = group_rank;
  o.size = int(members.size());
  o.timeout = opts.timeout;
  o.cancel = opts.cancel;
  o.host = opts.host;
  return make_socket_communicator(store, o);
}

}  // namespace

void ProcessGroups::abort_all() {
  for (auto* c : {world.get(), tp.get(), pp.get(), dp.get(), emb.get()})
    if (c) c->abort();
}

bool ProcessGroups::any_aborted() const {
  for (const auto* c : {world.get(), tp.get(), pp.get(), dp.get(), emb.get()})
    if (c && c->aborted()) return true;
  return false;
}

ProcessGroups make_process_groups(const Topology& topo, int rank, std::shared_ptr<Store> store,
                                  const ProcessGroupOptions& opts) {
  ProcessGroups g;
  std::vector<int> all(topo.world_size());
  for (int r = 0; r < topo.world_size(); ++r) all[r] = r;
  // The world group carries host-side step metrics only, so it always uses sockets.
  ProcessGroupOptions host = opts;
  host.device = DeviceKind::kCpu;
  g.world = make_group(all, rank, "world", store, host);
  g.tp = make_group(topo.tp_group(rank), rank, topo.tp_group_name(rank), store, opts);
  g.pp = make_group(topo.pp_group(rank), rank, topo.pp_group_name(rank), store, opts);
  g.dp = make_group(topo.dp_group(rank), rank, topo.dp_group_name(rank), store, opts);
  g.emb =
      make_group(topo.embedding_group(rank), rank, topo.embedding_group_name(rank), store, opts);
  return g;
}

}  // namespace keel
