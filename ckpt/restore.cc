// Restore from the own slot or the backup holder; see restore.h.
#include "ckpt/restore.h"

#include <algorithm>

#include "ckpt/backup_service.h"
#include "ckpt/snapshot_region.h"
#include "model/train_state.h"

namespace keel {

namespace {

// Surveys read slot headers only, so a slot found damaged when it is used is dropped: the
// next survey no longer offers its step. (The verification is repeated only here, on the
// rare failure, to tell damage from a missing step or another layout.)
void drop_if_damaged(SnapshotRegion& region, int64_t step, const TrainState& state) {
  if (!region.writable()) return;
  std::optional<SlotView> v = region.find(step);
  if (v && v->fingerprint == state.layout_fingerprint() && v->bytes == state.bytes() &&
      !SnapshotRegion::verify(*v, nullptr))
    region.begin_write(v->slot);
}

}  // namespace

RestoreResult restore_state(TrainState& state, int64_t step, SnapshotRegion* own,
                            const std::string& holder_addr, int owner_rank, int holder_rank,
                            std::chrono::milliseconds timeout) {
  std::vector<BackupSource> servers;
  if (!holder_addr.empty()) servers.push_back({holder_addr, holder_rank});
  return restore_state(state, step, own, servers, owner_rank, timeout);
}

RestoreResult restore_state(TrainState& state, int64_t step, SnapshotRegion* own,
                            const std::vector<BackupSource>& servers, int owner_rank,
                            std::chrono::milliseconds timeout) {
  RestoreResult result;
  std::string why;
  if (own) {
    std::string source = "own slot (" + own->name() + ")";
    if (own->read(step, state, &why)) {
      state.set_step(step);
      result.source = source;
      if (std::optional<SlotView> v = own->find(step)) result.checksum = v->checksum;
      return result;
    }
    drop_if_damaged(*own, step, state);
    result.skipped.push_back(source + ": " + why);
  } else {
    result.skipped.push_back("own slot: no snapshot segment");
  }
  for (const BackupSource& server : servers) {
    std::string source = server.rank >= 0 ? detail::concat("backup held by rank ", server.rank,
                                                           " (", server.addr, ")")
                                          : "backup at " + server.addr;
    try {
      BackupClient client(server.addr, timeout);
      uint64_t sum = 0;
      if (client.fetch(owner_rank, step, state, &why, &sum)) {
        result.checksum = sum;
        state.set_step(step);
        result.source = source;
        return result;
      }
    } catch (const BackupError& e) {
      why = e.what();
    }
    result.skipped.push_back(source + ": " + why);
  }
  if (servers.empty()) result.skipped.push_back("backup: no holder");
  std::string msg = detail::concat("cannot restore rank ", owner_rank, " to step ", step, ":");
  for (const auto& s : result.skipped) msg += "\n  " + s;
  throw RestoreError(msg);
}

std::vector<int64_t> verified_steps(const SnapshotRegion& region, int owner) {
  std::vector<int64_t> out;
  for (int64_t s : region.valid_steps(owner)) {
    std::optional<SlotView> v = region.find(s, owner);
    std::string why;
    if (v && SnapshotRegion::verify(*v, &why)) out.push_back(s);
  }
  return out;
}

std::vector<int64_t> held_steps(const std::string& job, int owner, int holder, bool replica) {
  const std::string name =
      replica ? snapshot_segment_name(job, holder) : backup_segment_name(job, holder);
  auto region = SnapshotRegion::open_existing(name);
  return region ? region->valid_steps(replica ? -1 : owner) : std::vector<int64_t>{};
}

std::vector<int64_t> restorable_steps(const std::string& job, int rank, int holder, bool verify) {
  std::vector<int64_t> out;
  auto take = [&](const SnapshotRegion& region, int owner) {
    for (int64_t s : verify ? verified_steps(region, owner) : region.valid_steps(owner))
      out.push_back(s);
  };
  if (auto own = SnapshotRegion::open_existing(snapshot_segment_name(job, rank))) take(*own, -1);
  if (holder >= 0) {
    if (auto backup = SnapshotRegion::open_existing(backup_segment_name(job, holder)))
      take(*backup, rank);
  }
  std::sort(out.rbegin(), out.rend());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace keel
