#include "model/job_layout.h"

#include "runtime/check.h"

namespace keel {

keel_model_dims model_dims(const config::JobConfig& cfg) {
  const auto& m = cfg.model();
  keel_model_dims d{};
  d.num_layers = m.num_layers();
  d.hidden_size = m.hidden_size();
  d.num_heads = m.num_heads();
  d.ffn_hidden_size = m.ffn_hidden_size() > 0 ? m.ffn_hidden_size() : 4 * m.hidden_size();
  d.seq_len = m.seq_len();
  d.vocab_size = m.vocab_size();
  d.padded_vocab_size =
      m.padded_vocab_size() > 0 ? m.padded_vocab_size() : (m.vocab_size() + 127) / 128 * 128;
  d.init_std = m.init_std();
  return d;
}

std::vector<int> stage_layer_counts(const config::JobConfig& cfg) {
  const int P = cfg.parallel().pp(), L = cfg.model().num_layers();
  if (cfg.parallel().stage_layers_size() > 0)
    return {cfg.parallel().stage_layers().begin(), cfg.parallel().stage_layers().end()};
  std::vector<int> counts(P, L / P);
  for (int i = 0; i < L % P; ++i) ++counts[i];
  return counts;
}

keel_stage stage_of(const config::JobConfig& cfg, Coord c) {
  std::vector<int> counts = stage_layer_counts(cfg);
  KEEL_CHECK(c.pp < int(counts.size()), "pp coordinate ", c.pp, " of ", counts.size());
  keel_stage s{};
  s.tp_rank = c.tp;
  s.tp_size = cfg.parallel().tp();
  s.pp_rank = c.pp;
  s.pp_size = cfg.parallel().pp();
  for (int p = 0; p < c.pp; ++p) s.layer_begin += counts[p];
  s.layer_end = s.layer_begin + counts[c.pp];
  return s;
}

keel_stage single_rank_stage(const config::JobConfig& cfg) {
  keel_stage s{};
  s.tp_size = 1;
  s.pp_size = 1;
  s.layer_end = cfg.model().num_layers();
  return s;
}

}  // namespace keel
