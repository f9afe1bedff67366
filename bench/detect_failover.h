// The failover rows of keel-bench detect (issue 28): what a job with etcd and controller
// candidates loses when its controller, slot 0, or a slot's processes die, or a slot goes
// silent. The tiny TP2xPP2xDP2 job under keel-launch --local 5 --standby 1 (4 slots of 2
// workers, one warm standby, etcd members and candidates on slots 0-2), hot swap, one run per
// trial:
//   controller_crash  the leader controller killed -9 from outside (the PID the election
//                     names): "detected" is the new leader's takeover;
//   slot0_loss        slot 0 lost whole (fault slot_loss at rank 0);
//   swap_by_death     slot 3's processes die (fault slot_loss at rank 6): seen by the agent's
//                     closed connection;
//   swap_by_silence   slot 3's agent and workers stopped from outside (SIGSTOP): seen by its
//                     heartbeats' silence (detect.slot_timeout_ms), as a cut or powered-off
//                     machine.
// (Slot 3 runs no etcd member: the swap rows measure the detection and the swap alone.)
// Per row: detected (the incident's detection, or the takeover, minus the injection), the
// first step completed after the injection, and the stall: the longest gap between two steps
// completed around the injection (for a controller crash, training should not stop at all).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace keel::bench {

// The rows, in the order they are measured.
const std::vector<std::string>& failover_kinds();

// Measures `kinds` (a subset of failover_kinds()), `trials` runs each, in `dir`, printing one
// table. `config(steps)` writes the tiny job's config for `steps` steps and returns its path;
// `sets` are keel-launch flags every run gets (" --set ...").
void failover_rows(const std::string& dir, const std::function<std::string(int)>& config,
                   const std::string& sets, const std::vector<std::string>& kinds, int trials);

}  // namespace keel::bench
