#include "robust/reshape_layout.h"

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include "runtime/check.h"

namespace keel::policy {

namespace {

// Larger is better: the order of the file comment's preferences.
std::tuple<int, int, int, int> rank_of(const Topology& t, const ReshapeRequest& r) {
  // A share smaller than the configured one is no better: the configured layout had room.
  const int share = std::min(t.tp() * t.pp(), r.configured.tp() * r.configured.pp());
  return {t.world_size(), share, -std::abs(t.tp() - r.configured.tp()),
          -std::abs(t.pp() - r.configured.pp())};
}

}  // namespace

std::string layout_label(const Topology& t) {
  return detail::concat("TP", t.tp(), "xPP", t.pp(), "xDP", t.dp());
}

std::optional<ReshapeChoice> choose_reshape(const ReshapeRequest& r, std::string* why_not) {
  KEEL_CHECK(r.workers_per_slot >= 1 && r.micro_batch >= 1 && r.global_batch >= 1,
             "choose_reshape: workers_per_slot ", r.workers_per_slot, ", micro_batch ",
             r.micro_batch, ", global_batch ", r.global_batch);
  const int cap = std::min(r.live_slots * r.workers_per_slot, r.configured.world_size());
  std::optional<Topology> best;
  std::string first_refusal;
  for (int tp = 1; tp <= cap; ++tp)
    for (int pp = 1; tp * pp <= cap; ++pp)
      for (int dp = 1; tp * pp * dp <= cap; ++dp) {
        const Topology t(tp, pp, dp);
        if (t.world_size() % r.workers_per_slot != 0) continue;  // whole slots only
        if (r.global_batch % (r.micro_batch * dp) != 0) continue;
        if (r.invalid) {
          const std::string why = r.invalid(t);
          if (!why.empty()) {
            if (first_refusal.empty()) first_refusal = layout_label(t) + ": " + why;
            continue;
          }
        }
        if (!best || rank_of(t, r) > rank_of(*best, r)) best = t;
      }
  if (!best) {
    if (why_not)
      *why_not =
          detail::concat("no layout of at most ", cap, " rank(s) on whole slots of ",
                         r.workers_per_slot, " keeps train.global_batch_size = ", r.global_batch,
                         " with micro-batches of ", r.micro_batch, " and fits the model",
                         first_refusal.empty() ? std::string() : " (e.g. " + first_refusal + ")");
    return std::nullopt;
  }
  ReshapeChoice c;
  c.topo = *best;
  c.slots = best->world_size() / r.workers_per_slot;
  const bool back = best->world_size() == r.configured.world_size() &&
                    best->tp() == r.configured.tp() && best->pp() == r.configured.pp();
  c.why = detail::concat(layout_label(*best), " on ", c.slots, " of ", r.live_slots, " slot(s)",
                         back ? " (the configured layout)"
                              : detail::concat(" (configured ", layout_label(r.configured), ", ",
                                               r.global_batch / (r.micro_batch * best->dp()),
                                               " micro-batch(es) per replica a step)"));
  return c;
}

}  // namespace keel::policy
