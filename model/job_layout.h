// What the job config means for one coordinate: the plugin's model dims and the stage
// (layer range) a (tp, pp) coordinate serves.
#pragma once

#include <vector>

#include "model/plugin.h"
#include "parallel/topology.h"
#include "proto/config.pb.h"

namespace keel {

keel_model_dims model_dims(const config::JobConfig& cfg);

// Layers per pipeline stage: parallel.stage_layers, or as even as possible with the extra
// layers on the first stages (the last stage also runs the head).
std::vector<int> stage_layer_counts(const config::JobConfig& cfg);

keel_stage stage_of(const config::JobConfig& cfg, Coord c);

// The whole model on one rank (tp = pp = 1): the canonical parameter order of reports and
// checksums.
keel_stage single_rank_stage(const config::JobConfig& cfg);

}  // namespace keel
