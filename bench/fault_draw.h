// keel-bench --mtbf-s: a fault schedule drawn from a Poisson process, repeatable by its seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/faults.pb.h"

namespace keel::bench {

// Faults at the steps of a Poisson process with a mean of `mtbf_s` seconds between failures
// (`step_s` seconds per step) over steps [1, steps): kinds (names of faults::Fault::Kind) and
// ranks in [0, world) drawn uniformly, at most one fault per step; slow and slow_link get a
// 60 ms delay. The same arguments give the same schedule.
faults::FaultSchedule draw_schedule(double mtbf_s, double step_s, int64_t steps, int world,
                                    const std::vector<std::string>& kinds, uint64_t seed);

}  // namespace keel::bench
