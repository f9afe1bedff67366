// A rank's part in a reshape (recovery.on_no_standby = reshape, issue 30 part 2; the plan is
// robust/reshape_plan.h): the job goes on in another TP × PP × DP, on the slots it has left
// or, growing back, on those and the standbys that returned. Every rank of the new layout
// reads, through the resharding planner, only the byte ranges of the old ranks' copies of
// the restore step it needs, from the backup servers the old ranks ran in the epoch before
// (a survivor's serves its own snapshot, a holder's the backup it keeps; a DP replica's own
// snapshot is the same state without ZeRO-1). The old servers stay up until every new rank
// has read: only then does a survivor let its old copies go.
#include <set>

#include "ckpt/backup_placement.h"
#include "ckpt/checkpoint_reshard.h"
#include "ckpt/memory_reshard.h"
#include "launcher/worker/worker_impl.h"
#include "proto/store_keys.h"
#include "runtime/logging.h"

namespace keel::worker_detail {
namespace {

// How long an old server's address may take to be found: published in the epoch before, or
// never (its rank died before publishing it).
constexpr Millis kAddressWait{1000};

}  // namespace

void Worker::reshape(int rank, const membership::Rebuild& rb) {
  const int old_rank = o_.rank;
  // What the others read of this rank is its snapshot of its live step: written in full.
  if (snapshots_->snapshotter()) snapshots_->snapshotter()->wait_idle();
  apply_membership(rb.membership());
  auto next = make_train_state(cfg_, backend_.get(), *plugin_, members_.topo(), rank);
  read_old_layout(rank, rb, *next);
  snapshots_->close(old_rank);
  take_id(rank, std::move(next));
}

void Worker::read_old_layout(int rank, const membership::Rebuild& rb, TrainState& into) {
  // From a persistent checkpoint, load_epoch's restore() reads it into the new layout.
  if (rb.source() != membership::memory) return;
  const membership::Membership& was = rb.reshard_from();
  const Topology old_topo(was.tp(), was.pp(), was.dp()), &topo = members_.topo();
  const int old_epoch = epoch() - 1;
  const int64_t S = rb.restore_step();
  // sharded_layout lays the config out as the topology says: the old layout from cfg_ too.
  const ShardedLayout from = sharded_layout(*plugin_, cfg_, old_topo);
  const ShardedLayout to = sharded_layout(*plugin_, cfg_, topo);
  const bool replicas = replicas_hold_backups(old_topo, cfg_.parallel().zero1());
  // Only survivors kept their servers: a lost rank's, or a retired one's, is gone.
  std::set<int> survivors;
  for (const auto& [o, n] : rb.renumber()) survivors.insert(o);
  std::map<int, std::string> addr;
  auto address = [&](int r) -> const std::string& {
    auto it = addr.find(r);
    if (it != addr.end()) return it->second;
    std::string a;
    try {
      a = get_message<store::Endpoint>(*store_, keys::backup_addr_key(old_epoch, r), kAddressWait)
              .address();
    } catch (const std::exception& e) {
      LOG(WARNING) << "rank " << rank << ": no backup server of old rank " << r << ": " << e.what();
    }
    return addr.emplace(r, a).first->second;
  };
  const CopySources sources = [&](int r) {
    std::vector<BackupSource> out;
    auto add = [&](int server, int copy_of) {
      if (!survivors.count(server) || address(server).empty()) return;
      out.push_back({address(server), server, copy_of});
    };
    add(r, -1);
    const int holder = backup_holder(old_topo, r, replicas).holder;
    if (holder >= 0) add(holder, replicas ? holder : -1);
    return out;
  };
  std::string failed;
  try {
    StateRewrite rw(into);
    load_state_from_memory(from, to, rank, S, sources, into, comm_timeout());
    rw.commit();
  } catch (const std::exception& e) {
    failed = e.what();
  }
  // Every new rank says it has read (or could not); the old copies go only after all.
  store::Step done;
  done.set_step(failed.empty() ? S : -1);
  set_message(*store_, keys::reshard_read_key(epoch(), rank), done);
  if (!failed.empty()) throw RestoreError(failed);
  for (int r = 0; r < topo.world_size(); ++r) {
    const auto d =
        get_message<store::Step>(*store_, keys::reshard_read_key(epoch(), r), comm_timeout());
    if (d.step() != S)
      throw RestoreError(detail::concat("rank ", r, " of the new layout could not read step ", S,
                                        " from the old ranks' copies"));
  }
  LOG(INFO) << "rank " << rank << ": step " << S << " read into " << layout_name(topo)
            << " from the old ranks' copies in memory (" << layout_name(old_topo) << ")";
}

}  // namespace keel::worker_detail
