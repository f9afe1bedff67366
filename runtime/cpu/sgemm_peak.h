// The CPU's peak for MFU: a measured SGEMM rate, since no datasheet number describes a
// shared, frequency-scaled host. Measured once per (CPU model, thread count) and cached on
// disk, because a second of GEMM at every start would distort short benchmarks.
#pragma once

#include <string>

namespace keel {

struct PeakFlops {
  double flops_per_s = 0;
  std::string source;  // e.g. "measured SGEMM 1536^3, 2 threads, AMD EPYC (cached)"
};

// The best rate of a 1536³ single-precision GEMM on OpenBLAS with `threads` threads
// (<= 0: all cores), best of several runs after a warm-up (about a second in all). The result
// is cached in $KEEL_CACHE_DIR, else $HOME/.cache/keel, as sgemm_peak_<threads>t.txt keyed by
// the CPU model name; a cache for another CPU model is measured again and overwritten.
// Concurrent callers on one machine serialise on a lock file so that they do not measure
// each other. A measurement during which the threads did not have their cores (process CPU
// time under 90% of wall time × threads) is returned but not cached, and its source says
// "(machine busy, not cached)". Leaves OpenBLAS single-threaded, as the CPU backend runs it.
PeakFlops cpu_sgemm_peak(int threads);

// The CPU model as /proc/cpuinfo names it ("unknown CPU" if it does not); the cache key.
std::string cpu_model_name();

}  // namespace keel
