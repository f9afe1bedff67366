// A rank's memory, estimated from the job config alone, before the plugin is loaded or any
// buffer allocated: a job too large for the machine is refused with the numbers, instead of
// growing for minutes and being OOM-killed without a word.
//
// The estimate follows what the Trainer and the GPT plugin allocate (model/gpt/gpt_layout.cc
// lists the buffers); it does not call the plugin, so it is a formula for a GPT. A plugin of
// another shape is still bounded by its parameters, which dominate any model worth checking.
#pragma once

#include <string>

#include "proto/config.pb.h"
#include "runtime/check.h"  // keel::InputError, which these functions throw

namespace keel {

// Bytes one rank of pipeline stage `pp_rank` holds. Every rank of a stage needs the same
// (TP shards are equal; ZeRO-1 shards differ by padding only).
struct MemoryEstimate {
  int pp_rank = 0;
  int in_flight = 0;       // micro-batches whose activations are alive at once under 1F1B
  double params = 0;       // parameters of this stage's TP shard (the tied head included)
  double grads = 0;        // one gradient per parameter
  double moments = 0;      // AdamW m and v: all parameters, or a 1/dp shard with ZeRO-1
  double activations = 0;  // in_flight × (the stage's activations, tokens, received input)
  double scratch = 0;      // one micro-batch's backward scratch, stage outputs and gradients
  double comm = 0;         // data-parallel bucket buffers
  double process = 0;      // the process itself on the host: code, libraries, thread stacks
  double snapshot = 0;     // host shared memory: 2 own snapshot slots of parameters and
                           // moments, and 2 slots of the peer backup this rank holds where
                           // backups are pushed (not when DP replicas hold them), and with
                           // SDC checks on the verified slot (and the peer's where pushed)
  int backup_slots = 0;    // of those, the peer backup's (0 or 2)
  int verified_slots = 0;  // and the SDC checks' verified snapshot (own, and pushed: 0-2)
  // Bytes on the rank's device (host memory on CPU).
  double device_bytes() const { return params + grads + moments + activations + scratch + comm; }
  // Bytes of host memory: on CPU everything, on CUDA the process and the snapshot slots.
  // On CPU with snapshots the live parameters and moments are one of the slots, not extra.
  double host_bytes(bool cuda) const {
    const double live_in_slots = snapshot > 0 ? params + moments : 0;
    return (cuda ? 0 : device_bytes() - live_in_slots) + process + snapshot;
  }
  // "parameters 1.2 GiB, gradients ..., snapshot slots 4.8 GiB".
  std::string describe() const;
};

MemoryEstimate estimate_rank_memory(const config::JobConfig& cfg, int pp_rank);

// Host memory free for a new job: MemAvailable from /proc/meminfo, lowered to what the
// cgroup (v2 memory.max − memory.current) still allows when that is less.
struct AvailableMemory {
  double bytes = 0;  // < 0 when unknown (no /proc/meminfo): nothing is refused then
  std::string source;
};
AvailableMemory available_host_memory();

// Refuses (InputError) a job whose ranks [first_rank, first_rank + num_ranks) of the
// Megatron layout, all on this machine, need more host memory than `available`: on CPU
// everything, on CUDA the snapshot slots (device memory is checked when it is allocated).
// The message gives the total, what is available and where that number came from, the
// breakdown of the largest rank and the fields that shrink it.
void check_memory_fits(const config::JobConfig& cfg, int first_rank, int num_ranks,
                       const AvailableMemory& available);

// "1.5 GiB", "320.0 MiB", "12.0 KiB".
std::string format_bytes(double bytes);

}  // namespace keel
