#include "launcher/worker/applied_membership.h"

#include "runtime/check.h"

namespace keel {

membership::Membership AppliedMembership::from_config(const config::JobConfig& cfg) {
  membership::Membership m;
  m.set_tp(cfg.parallel().tp());
  m.set_pp(cfg.parallel().pp());
  m.set_dp(cfg.parallel().dp());
  return m;
}

void AppliedMembership::apply(const membership::Membership& m, config::JobConfig* cfg) {
  if (m.tp() < 1 || m.pp() < 1 || m.dp() < 1)
    throw Error(detail::concat("the membership of epoch ", m.epoch(), " has tp", m.tp(), " pp",
                               m.pp(), " dp", m.dp(), ": every size must be at least 1"));
  // A reshape (recovery.on_no_standby = reshape) changes tp and pp as well: the membership
  // is the layout. Fixed stages cannot follow another pp (the controller never picks one).
  if (m.pp() != cfg->parallel().pp() && cfg->parallel().stage_layers_size() > 0)
    throw Error(detail::concat("the membership of epoch ", m.epoch(), " has pp", m.pp(),
                               ", but parallel.stage_layers fixes pp", cfg->parallel().pp()));
  const int world = m.tp() * m.pp() * m.dp();
  if (m.rank_slot_size() != 0 && m.rank_slot_size() != world)
    throw Error(detail::concat("the membership of epoch ", m.epoch(), " places ",
                               m.rank_slot_size(), " rank(s), but its layout has ", world));
  m_ = m;
  topo_ = Topology(m.tp(), m.pp(), m.dp());
  cfg->mutable_parallel()->set_tp(m.tp());
  cfg->mutable_parallel()->set_pp(m.pp());
  cfg->mutable_parallel()->set_dp(m.dp());
}

std::vector<int> AppliedMembership::ranks_on_slot(int slot) const {
  std::vector<int> out;
  for (int r = 0; r < m_.rank_slot_size(); ++r)
    if (m_.rank_slot(r) == slot) out.push_back(r);
  return out;
}

}  // namespace keel
