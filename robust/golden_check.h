// The golden self-check (DESIGN.md, Failure handling): a machine trains a fixed mini GPT for
// three steps and must end with parameters bitwise equal to those the repository recorded for
// its backend and precision (robust/golden_digests.h, written by
// scripts/regen-golden-digests.sh). A defective core or GPU that computes wrong without
// crashing passes a tolerance-based GEMM check when its error is small, but in deterministic
// mode any wrong bit anywhere in forward, backward or the optimizer changes the digest.
// Standbys and readmitted machines run it before they may train; the in-flight SDC check runs
// it as a third opinion when two DP replicas disagree (it takes a few ms on CPU).
//
// The check tests the machine, not the job's model: it always trains keel's own GPT
// (golden_plugin()), whatever plugin the job trains. A digest only means something against a
// reference computed from the same code, and the repo can only hold references for code it
// ships; the other way, a digest each job first computes for its own plugin on a trusted
// machine, would need a machine known to be good before any machine has been checked, and a
// wrong reference from it would mark every good standby defective. So a third-party plugin
// gets standbys, readmission and the SDC tie-break without recording anything.
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

// The model every golden check in the runtime trains: keel's GPT plugin as shipped beside the
// running executable (libkeel_gpt.so in the same bin/ folder), so neither the job's plugin nor
// a file of that name in the working directory can change the reference. Loaded once per
// process; throws InputError when the file is missing or untrusted (model/plugin_loader.h).
std::shared_ptr<Plugin> golden_plugin();

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

// The same on golden_plugin(): what standbys, diagnostics and the SDC tie-break run. A
// golden plugin that cannot be loaded is a failed check whose message says why.
GoldenCheckResult golden_check(Backend& backend, const TrainerHooks& hooks = {},
                               std::optional<uint64_t> reference = std::nullopt,
                               Precision precision = Precision::kFp32);

// The key this process's golden digest is kept under: "cpu fp32 <OpenBLAS core>" on CPU
// (always fp32), "cuda <fp32|bf16> <device name>" on a GPU.
std::string golden_key(const Backend& backend, Precision precision = Precision::kFp32);

// The repo's digest for `key`, if robust/golden_digests.h has one.
std::optional<uint64_t> golden_reference(const std::string& key);

}  // namespace keel
