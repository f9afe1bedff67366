#include "ckpt/memory_reshard.h"

#include <map>
#include <memory>
#include <string>

#include "ckpt/backup_service.h"
#include "ckpt/checkpoint_reshard.h"
#include "model/train_state.h"
#include "runtime/check.h"

namespace keel {

void load_state_from_memory(const ShardedLayout& from, const ShardedLayout& to, int rank,
                            int64_t step, const CopySources& sources, TrainState& state,
                            std::chrono::milliseconds timeout) {
  const std::vector<CopyRun> runs = plan_reshard(from, to, rank);
  const RankStateShape shape = rank_state_shape(to, rank);
  KEEL_CHECK(shape.fingerprint == state.layout_fingerprint(),
             "the planned layout differs from rank ", rank, "'s state");
  std::map<std::string, std::unique_ptr<BackupClient>> clients;  // one connection a server
  std::map<int, RankStateShape> old;                             // the source ranks' shapes
  // Reads one run from the first source that gives it.
  auto read = [&](const CopyRun& r, float* out) {
    auto it = old.find(r.src_rank);
    if (it == old.end()) it = old.emplace(r.src_rank, rank_state_shape(from, r.src_rank)).first;
    const RankStateShape& s = it->second;
    // A copy's payload is the state's spans in order: parameters, first and second moments.
    size_t base = 0;
    for (int k = 0; k < r.span; ++k) base += s.span_floats(k);
    const size_t offset = (base + r.src_offset) * sizeof(float), bytes = r.floats * sizeof(float);
    std::string tried;
    for (const BackupSource& src : sources(r.src_rank)) {
      auto& c = clients[src.addr];
      if (!c) c = std::make_unique<BackupClient>(src.addr, timeout);
      std::string why;
      try {
        const int owner = src.copy_of >= 0 ? src.copy_of : r.src_rank;
        if (c->fetch_range(owner, step, s.fingerprint, offset, bytes, out, &why)) return;
      } catch (const BackupError& e) {
        why = e.what();
      }
      tried +=
          detail::concat(tried.empty() ? "" : "; ", "rank ", src.rank, " at ", src.addr, ": ", why);
    }
    throw RestoreError(detail::concat("rank ", rank, " of the new layout needs step ", step,
                                      " of rank ", r.src_rank, " and no copy gave it (",
                                      tried.empty() ? "no source known" : tried, ")"));
  };
  carry_out_reshard(runs, shape, state, read);
  state.set_step(step);
}

}  // namespace keel
