// The resharding planner: which floats of which rank file of a checkpoint written in one
// layout make up a rank's state in another (DESIGN.md, Checkpoints). Pure code: it works on
// the plugin's parameter tables alone, so a third-party plugin is resharded as the GPT is:
// TP splits as each parameter's tp_dim and tp_blocks declare them, a tied copy read from the
// parameter it is tied to, pipeline stages by name, ZeRO-1 shards of the AdamW moments as
// ranges of the flat buffers. The reader (ckpt/checkpoint_reshard.cc) carries a plan out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/param_store.h"
#include "model/plugin.h"
#include "parallel/topology.h"

namespace keel {

// A layout's parameter tables: what each rank of a job holds, or what each rank file of a
// checkpoint holds.
struct ShardedLayout {
  int tp = 1, pp = 1, dp = 1;
  bool zero1 = false;  // ZeRO-1 as configured; it shards only where dp > 1
  // By coordinate, index pp_rank · tp + tp_rank: that coordinate's parameter table in the
  // plugin's describe order (every DP replica holds the same).
  std::vector<std::vector<keel_param_desc>> tables;

  int world() const { return tp * pp * dp; }
  Topology topology() const { return Topology(tp, pp, dp); }
  const std::vector<keel_param_desc>& table(Coord c) const {
    return tables[size_t(c.pp * tp + c.tp)];
  }
};

// Where one rank's state lies in its TrainState::spans() (and in its rank file's payload).
struct RankStateShape {
  ParamLayout params;        // the parameters' slots and padded size
  size_t moment_floats = 0;  // of each moment span
  size_t moment_begin = 0;   // the first float of the parameters' buffer its moments cover
  uint64_t fingerprint = 0;  // TrainState::layout_fingerprint() of such a state
  size_t span_floats(int span) const { return span == 0 ? params.padded : moment_floats; }
  size_t floats() const { return params.padded + 2 * moment_floats; }
};
RankStateShape rank_state_shape(const ShardedLayout& layout, int rank);

// One contiguous copy from a rank file's span into the target rank's span of the same kind.
struct CopyRun {
  int span = 0;           // TrainState::spans() order: 0 params, 1 adam_m, 2 adam_v
  int src_rank = 0;       // whose file
  size_t src_offset = 0;  // floats into that rank's span
  size_t dst_offset = 0;  // floats into the target rank's span
  size_t floats = 0;
};

// Every float of rank `rank` of `to` that holds a parameter or a moment of one, read from
// where `from` keeps it (padding is not covered: it stays zero). Runs that continue each
// other are merged: a tensor both layouts keep whole is one run per span. Throws InputError naming
// the first parameter of `to` that `from` lacks or shapes otherwise, e.g.
//   "parameter 'h.0.attn.qkv.weight': shape [192, 64] in the checkpoint, [96, 64] in this job"
std::vector<CopyRun> plan_reshard(const ShardedLayout& from, const ShardedLayout& to, int rank);

}  // namespace keel
