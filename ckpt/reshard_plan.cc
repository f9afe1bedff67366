#include "ckpt/reshard_plan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "model/train_state.h"
#include "runtime/check.h"

namespace keel {
namespace {

std::string shape_text(const keel_param_desc& d) {
  std::string s = "[";
  for (int i = 0; i < d.ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(d.shape[i]);
  }
  return s + "]";
}

bool same_shape(const keel_param_desc& a, const keel_param_desc& b) {
  return a.ndim == b.ndim && std::equal(a.shape, a.shape + a.ndim, b.shape);
}

// A run of a source shard in global coordinates, with where it lies in its rank's buffer.
struct SourceRun {
  size_t global, count;
  int tp_rank;
  size_t flat;  // float offset of its first element in the coordinate's flat buffer
};

// Where the checkpoint keeps one global tensor: its stage and, per TP rank, its slot.
struct SourceTensor {
  int pp_rank = 0;
  keel_param_desc desc{};
  std::vector<SourceRun> runs;  // every TP rank's runs, by global offset
};

bool effective_zero1(const ShardedLayout& l) {
  return l.zero1 && l.dp > 1;
}

// Appends a run, merged into the previous one when it continues it.
void emit(std::vector<CopyRun>* out, const CopyRun& r) {
  if (!out->empty()) {
    CopyRun& b = out->back();
    if (b.span == r.span && b.src_rank == r.src_rank && b.src_offset + b.floats == r.src_offset &&
        b.dst_offset + b.floats == r.dst_offset) {
      b.floats += r.floats;
      return;
    }
  }
  out->push_back(r);
}

}  // namespace

RankStateShape rank_state_shape(const ShardedLayout& layout, int rank) {
  const Coord c = layout.topology().coord(rank);
  RankStateShape s;
  s.params = lay_out_params(layout.table(c), layout.tp, layout.dp);
  s.moment_floats = moment_floats(s.params.padded, layout.dp, layout.zero1);
  s.moment_begin = effective_zero1(layout) ? s.moment_floats * size_t(c.dp) : 0;
  s.fingerprint = layout_fingerprint(s.params.slots, s.params.padded, s.moment_floats);
  return s;
}

std::vector<CopyRun> plan_reshard(const ShardedLayout& from, const ShardedLayout& to, int rank) {
  KEEL_CHECK(from.tables.size() == size_t(from.tp * from.pp), "the checkpoint's layout has ",
             from.tables.size(), " tables for tp ", from.tp, " pp ", from.pp);
  KEEL_CHECK(to.tables.size() == size_t(to.tp * to.pp));
  const Topology from_topo = from.topology();

  // Every global tensor of the checkpoint, where it is not a tied copy (the copy holds the
  // same bytes as the tensor it is tied to: equal gradients, equal updates).
  std::map<std::string, SourceTensor> tensors;
  std::vector<ParamLayout> from_layouts;  // by coordinate, as tables
  for (int p = 0; p < from.pp; ++p)
    for (int t = 0; t < from.tp; ++t) {
      const ParamLayout l = lay_out_params(from.table({0, p, t}), from.tp, from.dp);
      for (const ParamSlot& s : l.slots) {
        if (s.tied_copy()) continue;
        SourceTensor& st = tensors[s.name];
        if (!st.runs.empty() && st.pp_rank != p)
          throw InputError(detail::concat("the checkpoint's parameter '", s.name,
                                          "' is held by pipeline stages ", st.pp_rank, " and ", p,
                                          " (a tied copy must be flagged KEEL_PARAM_TIED_COPY)"));
        st.pp_rank = p;
        st.desc = s.desc;
        for (const ShardRun& r : shard_runs(s.desc, t, from.tp))
          st.runs.push_back({r.global, r.count, t, s.offset + r.local});
      }
      from_layouts.push_back(l);
    }
  for (auto& [name, st] : tensors)
    std::sort(st.runs.begin(), st.runs.end(),
              [](const SourceRun& a, const SourceRun& b) { return a.global < b.global; });

  const Coord c = to.topology().coord(rank);
  const RankStateShape shape = rank_state_shape(to, rank);
  const size_t share_lo = shape.moment_begin, share_hi = share_lo + shape.moment_floats;
  // Moments of a ZeRO-1 checkpoint: flat offset f of a coordinate lies in replica f / shard.
  const bool from_z = effective_zero1(from);

  std::vector<CopyRun> params, moments[2];
  for (const ParamSlot& slot : shape.params.slots) {
    const std::string want =
        slot.tied_copy() && slot.desc.tied_to[0]
            ? std::string(slot.desc.tied_to, strnlen(slot.desc.tied_to, KEEL_PARAM_NAME_MAX))
            : slot.name;
    auto it = tensors.find(want);
    if (it == tensors.end())
      throw InputError(detail::concat("parameter '", want, "': not in the checkpoint"));
    const SourceTensor& src = it->second;
    if (!same_shape(src.desc, slot.desc))
      throw InputError(detail::concat("parameter '", want, "': shape ", shape_text(src.desc),
                                      " in the checkpoint, ", shape_text(slot.desc),
                                      " in this job"));
    for (const ShardRun& tr : shard_runs(slot.desc, c.tp, to.tp)) {
      // The source runs overlapping [tr.global, tr.global + tr.count).
      auto first = std::upper_bound(src.runs.begin(), src.runs.end(), tr.global,
                                    [](size_t g, const SourceRun& r) { return g < r.global; });
      if (first != src.runs.begin()) --first;
      for (auto sr = first; sr != src.runs.end() && sr->global < tr.global + tr.count; ++sr) {
        const size_t lo = std::max(tr.global, sr->global);
        const size_t hi = std::min(tr.global + tr.count, sr->global + sr->count);
        if (lo >= hi) continue;
        const size_t n = hi - lo;
        const size_t dst = slot.offset + tr.local + (lo - tr.global);
        const size_t src_flat = sr->flat + (lo - sr->global);
        emit(&params, {0, from_topo.rank({0, src.pp_rank, sr->tp_rank}), src_flat, dst, n});
        // Moments: only the target's share, from the replica whose shard holds each float.
        size_t a = std::max(dst, share_lo), b = std::min(dst + n, share_hi);
        while (a < b) {
          const size_t sf = src_flat + (a - dst);
          int replica = 0;
          size_t off = sf, len = b - a;
          if (from_z) {
            const size_t from_moments = moment_floats(
                from_layouts[size_t(src.pp_rank * from.tp + sr->tp_rank)].padded, from.dp, true);
            replica = int(sf / from_moments);
            off = sf % from_moments;
            len = std::min(len, from_moments - off);
          }
          const int src_rank = from_topo.rank({replica, src.pp_rank, sr->tp_rank});
          for (int m = 0; m < 2; ++m) emit(&moments[m], {1 + m, src_rank, off, a - share_lo, len});
          a += len;
        }
      }
    }
  }
  std::vector<CopyRun> all = std::move(params);
  for (auto& m : moments) all.insert(all.end(), m.begin(), m.end());
  return all;
}

}  // namespace keel
