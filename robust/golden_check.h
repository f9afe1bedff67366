// The golden self-check (DESIGN.md, Failure handling): a machine trains a fixed mini GPT for
// three steps and must end with parameters bitwise equal to those the repository recorded for
// its backend and precision (robust/golden_digests.h, written by
// scripts/regen-golden-digests.sh). A defective core or GPU that computes wrong without
// crashing passes a tolerance-based GEMM check when its error is small, but in deterministic
// mode any wrong bit anywhere in forward, backward or the optimizer changes the digest.
// Standbys and readmitted machines run it before they may train; the in-flight SDC check runs
// it as a third opinion when two DP replicas disagree (it takes a few ms on CPU).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "model/plugin_loader.h"
#include "model/trainer.h"
#include "runtime/backend.h"

namespace keel {

struct GoldenCheckResult {
  bool ok = false;        // digest == reference (the repo table's, or the caller's); true
                          // without any reference
  bool compared = false;  // a reference existed and was compared
  uint64_t digest = 0;    // block digest (runtime/block_digest.h) of the parameters after the
                          // steps; 0 when the run itself failed
  std::string key;        // "cpu fp32 Cooperlake" (BLAS core on CPU), "cuda bf16 NVIDIA H200"
  std::string message;    // one line saying what was compared and how it came out
};

// Trains the fixed mini GPT of `plugin` (one rank: tp = pp = dp = 1; fixed config, seed and
// synthetic tokens; 3 AdamW steps, two micro-batches each, clipping and weight decay on) on
// `backend` and compares the block digest of its parameters with `reference` when given,
// else with the repo's digest for golden_key(backend, precision). `hooks` are passed to the
// Trainer, so an injected fault reaches the run as a defective unit's would. A run that
// throws (a non-finite step, a plugin error) is a failed check with the error in `message`;
// the function itself does not throw.
// `precision` is the backend's GEMM precision (a Backend does not report it); it only picks
// the key. On CPU pass a backend with a fixed thread count (make_cpu_backend(1)) so the
// result does not depend on the machine's core count.
GoldenCheckResult golden_check(Backend& backend, std::shared_ptr<Plugin> plugin,
                               const TrainerHooks& hooks = {},
                               std::optional<uint64_t> reference = std::nullopt,
                               Precision precision = Precision::kFp32);

// The key this process's golden digest is kept under: "cpu fp32 <OpenBLAS core>" on CPU
// (always fp32), "cuda <fp32|bf16> <device name>" on a GPU.
std::string golden_key(const Backend& backend, Precision precision = Precision::kFp32);

// The repo's digest for `key`, if robust/golden_digests.h has one.
std::optional<uint64_t> golden_reference(const std::string& key);

}  // namespace keel
