// Reading a persistent checkpoint into any layout of the same model (DESIGN.md,
// Checkpoints): today's per-rank files, read through the resharding planner
// (ckpt/reshard_plan.h) with the plugin's parameter tables. A rank reads only the byte ranges
// its own state needs, into a host buffer no larger than its largest span.
// Why today's files and not a layout-independent format written once: a save stays each
// rank's own write of bytes it already holds (no gather, nothing new on the step path, the
// snapshot and backup formats unchanged), and reading another layout costs no more than
// reading the same one (keel-bench reshard, bench/RESULTS.md).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ckpt/persistent_checkpoint.h"
#include "ckpt/reshard_plan.h"
#include "model/plugin_loader.h"
#include "parallel/topology.h"
#include "proto/config.pb.h"

namespace keel {

// `base` with the model fields (describe_model) and the layout (tp, pp, dp, zero1, stage
// layers) that `m` records: the configuration the checkpoint was written under, as far as
// the state's shape goes. Throws InputError naming a field it cannot read.
config::JobConfig checkpoint_config(const ckpt::CheckpointManifest& m,
                                    const config::JobConfig& base);

// Every coordinate's parameter table of `cfg`'s model laid out as `topo`, as `plugin`
// describes them (InputError where the plugin refuses a coordinate).
ShardedLayout sharded_layout(const Plugin& plugin, const config::JobConfig& cfg,
                             const Topology& topo);

// Loads rank `rank` of a job running `cfg`'s model laid out as `topo` from `point`, in
// whatever layout it was written: parameters and both AdamW moments resharded, the step
// set. The same layout reads the rank's own file whole (load_rank). Throws InputError naming
// the file or the tensor that does not fit (nothing is changed then but the state's bytes,
// which the caller's StateRewrite discards).
void load_state(const ResumePoint& point, const Plugin& plugin, const config::JobConfig& cfg,
                const Topology& topo, int rank, TrainState& state);

// Carries out `runs` (plan_reshard's, for a rank of shape `shape`) into `state`, one span at
// a time through a host buffer of that span's size: read(run, out) puts the run's floats at
// `out`. The source is a checkpoint's rank files or the peers' in-memory copies
// (ckpt/memory_reshard.h).
void carry_out_reshard(const std::vector<CopyRun>& runs, const RankStateShape& shape,
                       TrainState& state, const std::function<void(const CopyRun&, float*)>& read);

// Whether `plugin`'s parameter tables, for the model and layout that `point` records (`base`
// supplying what the manifest does not), give every rank file's layout fingerprint and size:
// what for_each_full_tensor and load_state check before they read. Throws InputError naming the
// file and both values where one differs (another plugin or model wrote it).
void check_plugin_fits(const ResumePoint& point, const Plugin& plugin,
                       const config::JobConfig& base);

// The checkpoint's parameters as whole tensors, one at a time in the single-rank describe
// order (tied copies once), for an export: fn(desc, data) with data the row-major tensor.
// Host memory: the largest tensor. `base` supplies what the manifest does not record.
void for_each_full_tensor(
    const ResumePoint& point, const Plugin& plugin, const config::JobConfig& base,
    const std::function<void(const keel_param_desc&, const std::vector<float>&)>& fn);

}  // namespace keel
