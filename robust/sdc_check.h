// The silent data corruption check's decisions (DESIGN.md, Determinism; Failure handling):
// which replica recomputes whose micro-batch, and what the digests every rank reports at a
// check say — clean, a named culprit, or who must give a third opinion. Pure code: the
// digests come in, a verdict goes out; launcher/worker/sdc_checker.cc gathers them and acts.
//
// Every `every` steps (the step with (step + 1) % every == 0) every rank reports:
//  - recompute: the digests of its step's first micro-batch (gradient, boundary activation)
//    and of the first micro-batch of DP replica recompute_target()'s slice, recomputed on its
//    own pipeline before the step. Replicas hold the same shard and read the same data, so
//    checker and target must agree bit for bit;
//  - agreement: digests of its state entering the step; DP replicas hold identical parameters
//    (also with ZeRO-1, after the all-gather) and, without ZeRO-1, identical moments;
//  - at rest: whether its state still matches the checksum its snapshot committed.
// A rank whose state changed at rest, or the minority of an agreement vote, is named at once.
// Recompute mismatches at the lowest stage they appear at (a corrupted activation spoils the
// stages after it): a rank common to every mismatching pair of its coordinate, with two or
// more pairs, is named; otherwise the targets' replicas recompute their own micro-batch again
// (a transient flip does not repeat), and if that leaves a tie (two replicas, both in both
// pairs) every rank runs the golden mini-GPT (robust/golden_check.h) and the suspect that
// disagrees with the reference is named.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/trainer.h"
#include "parallel/comm_error.h"
#include "parallel/topology.h"

namespace keel::sdc {

// A check that finds corruption ends the epoch on every rank alike: the worker throws
// keel::SdcFound (launcher/worker/sdc_checker.h), which is no CommError.

// Whether the step with 0-based index `step` runs a check; `every` <= 0: never.
bool is_check_step(int64_t step, int every);
// The check's number (0, 1, ...) for a check step.
int64_t check_index(int64_t step, int every);
// The DP replica whose first micro-batch replica `d` of `dp` recomputes at check `k`: the
// offset rotates over 1 .. dp-1 so that every pairing recurs. -1 when dp == 1.
int recompute_target(int d, int dp, int64_t k);

// What one rank reports at a check.
struct RankReport {
  MicroBatchDigest own;               // its step's first micro-batch
  MicroBatchDigest recomputed;        // recompute_target()'s first micro-batch, on this rank
  uint64_t params = 0, m = 0, v = 0;  // its state entering the step
  bool at_rest_known = false;         // its snapshot recorded a checksum to compare with
  bool at_rest_ok = true;
  // For the world all-gather: this many floats, bit for bit.
  static constexpr size_t kFloats = 16;
  void pack(float* out) const;
  static RankReport unpack(const float* in);
};

struct Verdict {
  bool clean = true;
  std::vector<int> culprits;  // named ranks; empty with !clean: no clear culprit (yet)
  std::string tensor_class;   // "grad", "activation", "param", "optimizer", "state"
  std::string how;            // "recompute", "agreement", "at_rest", "recompute_again", "golden"
  std::set<int> suspects;     // ranks in a disagreement no rule resolved
  // Third opinions asked for (only when no culprit is named):
  std::set<int> recheck_replicas;  // DP replicas that recompute their own micro-batch again
  bool golden = false;             // every rank runs the golden mini-GPT
  std::string detail;              // one line, for the log and the incident
};

// The verdict of check `k` from every rank's report (indexed by rank). `zero1`: moments are
// sharded, so only parameters are compared across replicas.
Verdict judge(const Topology& topo, int64_t k, const std::vector<RankReport>& reports, bool zero1);

// After judge() asked for recheck_replicas: `again[r]` is rank r's first micro-batch
// recomputed once more on its own replica (only ranks of those replicas). A target whose
// recomputation now agrees with its checker had a transient fault: it is named; a target
// that repeats its result while its checker's differs leaves the checker suspect... and a tie
// asks for the golden check.
Verdict judge_recheck(const Topology& topo, int64_t k, const std::vector<RankReport>& reports,
                      const std::vector<MicroBatchDigest>& again, const Verdict& first);

// After a verdict asked for the golden check: `golden[r]` is rank r's golden digest; the
// reference is `repo` when the repo keeps one for this backend (unless most ranks disagree
// with it: then the table is stale, not the machines broken), else the value most ranks got.
// Suspects that differ from it are named.
Verdict judge_golden(const Verdict& before, const std::vector<uint64_t>& golden,
                     std::optional<uint64_t> repo);

}  // namespace keel::sdc
