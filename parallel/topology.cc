#include "parallel/topology.h"

#include "runtime/check.h"

namespace keel {

Topology::Topology(int tp, int pp, int dp) : tp_(tp), pp_(pp), dp_(dp) {
  if (tp < 1 || pp < 1 || dp < 1)
    throw InputError(detail::concat("topology: parallel sizes must be >= 1, got tp=", tp,
                                    " pp=", pp, " dp=", dp));
}

Coord Topology::coord(int rank) const {
  KEEL_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " of world ", world_size());
  return Coord{(rank / tp_) % dp_, rank / (tp_ * dp_), rank % tp_};
}

int Topology::rank(Coord c) const {
  return c.tp + c.dp * tp_ + c.pp * tp_ * dp_;
}

std::vector<int> Topology::tp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> out;
  for (int t = 0; t < tp_; ++t) out.push_back(rank({c.dp, c.pp, t}));
  return out;
}

std::vector<int> Topology::pp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> out;
  for (int p = 0; p < pp_; ++p) out.push_back(rank({c.dp, p, c.tp}));
  return out;
}

std::vector<int> Topology::dp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> out;
  for (int d = 0; d < dp_; ++d) out.push_back(rank({d, c.pp, c.tp}));
  return out;
}

std::vector<int> Topology::embedding_group(int r) const {
  Coord c = coord(r);
  if (pp_ == 1) return {rank({c.dp, 0, c.tp})};
  return {rank({c.dp, 0, c.tp}), rank({c.dp, pp_ - 1, c.tp})};
}

std::string Topology::tp_group_name(int r) const {
  Coord c = coord(r);
  return detail::concat("tp.dp", c.dp, ".pp", c.pp);
}
std::string Topology::pp_group_name(int r) const {
  Coord c = coord(r);
  return detail::concat("pp.dp", c.dp, ".tp", c.tp);
}
std::string Topology::dp_group_name(int r) const {
  Coord c = coord(r);
  return detail::concat("dp.pp", c.pp, ".tp", c.tp);
}
std::string Topology::embedding_group_name(int r) const {
  Coord c = coord(r);
  return detail::concat("emb.dp", c.dp, ".tp", c.tp);
}

}  // namespace keel
