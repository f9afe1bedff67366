// The CPU's peak for MFU: a measured SGEMM rate, since no datasheet number describes a
// shared, frequency-scaled host, shown next to a theoretical one (cpu_features.h). Measured
// once per (CPU model, ISA, BLAS build, BLAS core, thread count) and cached on disk, because
// a second of GEMM at every start would distort short benchmarks; a change of any of them
// (a new OpenBLAS, OPENBLAS_CORETYPE, another machine) measures again.
#pragma once

#include <string>

namespace keel {

struct PeakFlops {
  double flops_per_s = 0;
  // e.g. "measured SGEMM 2048^3, 2 threads, OpenBLAS Cooperlake, AMD EPYC (cached)"
  std::string source;
  double theoretical_flops_per_s = 0;  // 0 when the clock is unknown
  std::string theoretical_source;      // e.g. "2 cores x 2.60 GHz x 64 FLOP/cycle (AVX-512)"
  std::string cache_file;              // where the rate is cached ("" if nowhere)
};

// The best rate of a 2048³ single-precision GEMM (C = A·B, the shape numpy's reference
// measures) on OpenBLAS with its own `threads` threads (<= 0: all cores), best of several
// runs after a warm-up (about a second in all). The result is cached in $KEEL_CACHE_DIR, else
// $HOME/.cache/keel, in a file named after the thread count and a hash of
// sgemm_peak_cache_key(), which is also its first line; a file whose key differs is
// measured again. Concurrent callers on one machine serialise on a lock file so that they do
// not measure each other. A measurement during which the threads did not have their cores
// (process CPU time under 90% of wall time × threads) is returned but not cached, and its
// source says "(machine busy, not cached)". Leaves OpenBLAS single-threaded, as the CPU
// backend runs it.
PeakFlops cpu_sgemm_peak(int threads);

// The cache key: everything the rate depends on, e.g.
// "AMD EPYC | AVX-512 (F/BW/VL/DQ) +BF16 | OpenBLAS 0.3.21 ... | Cooperlake | 2 threads".
std::string sgemm_peak_cache_key(const std::string& cpu_model, const std::string& isa,
                                 const std::string& blas_config, const std::string& blas_core,
                                 int threads);
// The cache file's name for `key` and `threads`: sgemm_peak_<threads>t_<hash of key>.txt.
std::string sgemm_peak_cache_name(const std::string& key, int threads);
// The key of this process (its CPU, OpenBLAS build and loaded core).
std::string sgemm_peak_cache_key(int threads);

// Removes the cached rate (a peak found stale: an MFU above 100%), so the next start
// measures again. Harmless if there is none.
void forget_sgemm_peak(const PeakFlops& peak);

}  // namespace keel
