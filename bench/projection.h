// keel-bench project: the expected ETTR of each recovery policy at a given scale, from
// per-incident costs measured in keel-launch reports or documented defaults (the model:
// robust/ettr_projection.h).
#pragma once

namespace keel::bench {

// Parses the flags, prints the model's assumptions, a table per policy (failures per day, cost
// per incident by phase, ETTR) and the comparison with 97% ETTR on 9,600 GPUs; returns the
// process's exit status (0, or 2 on a usage error, said on stderr).
//
// argv is main's: argv[0] the program, then the flags; a leading "project" word at argv[1] is
// skipped, so keel-bench's main can pass its own argc/argv unchanged.
//
//   --machines N (1250)  --gpus-per-machine N (8)  --mtbf-hours H  --step-s S  --state-gb G
//   [--from report.json]...  [--link-gbps B (100)]  [--standbys K]  [--repair-hours R (24)]
//   [--policies hot_swap,in_place,restart_all]  [--checkpoint-every-steps N]  [--help]
int project_main(int argc, char** argv);

}  // namespace keel::bench
