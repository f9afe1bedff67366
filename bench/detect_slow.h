// keel-bench detect's fail-slow rows (robust/slow_rules.h): rounds from the onset of a slow
// rank to its detection at 1.5x, 2x and 4x slowdowns of the step, and false positives per
// 1,000 fault-free steps, on the tiny TP2xPP2xDP2 job under keel-launch with 2 standby slots.
#pragma once

#include <functional>
#include <string>

namespace keel::bench {

// `config(steps)` writes the job's config for that many steps and returns its path.
void fail_slow_rows(const std::string& dir, const std::function<std::string(int)>& config,
                    const std::string& sets, int healthy_steps);

}  // namespace keel::bench
