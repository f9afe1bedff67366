// Checks a machine runs before it is trusted with a rank (a warm standby before it parks,
// an evicted slot before it comes back): the device's GEMM against a reference computed in
// double on the host, and a small all-reduce among a group of peers. A machine that
// computes or communicates wrongly is kept out instead of corrupting a job silently.
#pragma once

#include <memory>
#include <string>

#include "parallel/store.h"
#include "runtime/backend.h"

namespace keel {

struct SelfCheckResult {
  bool ok = false;
  double max_rel_error = 0;  // GEMM against the double reference
  std::string message;       // what was checked, or what failed
};

// out = x·wᵀ + b for fixed pseudo-random x [64, 96], w [80, 96], b [80] on `backend`,
// compared element-wise with the double-precision result. The tolerance follows fp32 (or
// bf16 for kBf16) rounding over a reduction of length 96.
SelfCheckResult gemm_self_check(Backend& backend, Precision precision = Precision::kFp32);

// An all-reduce of each member's (rank + 1) over `size` peers meeting under `name` in
// `store`; every member must get size·(size+1)/2. A group of 1 passes trivially.
// `break_links`: the machine's network is defective (an injected link_error): its links
// break once connected, and the check fails as a real one would.
SelfCheckResult collective_self_check(std::shared_ptr<Store> store, const std::string& name,
                                      int rank, int size, const std::string& host,
                                      std::chrono::milliseconds timeout, bool break_links = false);

}  // namespace keel
