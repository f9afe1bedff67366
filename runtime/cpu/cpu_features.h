// What the host CPU can compute, read from CPUID (and XGETBV for what the OS enabled): the
// vector ISA that decides which BLAS kernels are the right ones (blas_core.h), and a
// theoretical FP32 peak to show next to the measured one (sgemm_peak.h).
#pragma once

#include <string>

namespace keel {

struct CpuFeatures {
  std::string vendor;  // CPUID vendor: "GenuineIntel", "AuthenticAMD", ...
  int family = 0;      // display family and model (extended fields folded in)
  int model = 0;
  std::string model_name;  // the brand string, e.g. "AMD EPYC" ("unknown CPU" if none)
  // Each flag means the CPU has it AND the OS saves its registers (XCR0), i.e. usable.
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false;
  int cores = 1;  // physical cores online (SMT siblings share FMA units)

  // e.g. "AMD EPYC (AuthenticAMD family 26 model 2)": the brand string alone may not say
  // which generation a VM runs on.
  std::string describe() const;
  // The AVX-512 subset the SkylakeX-class kernels need.
  bool avx512() const { return avx512f && avx512bw && avx512vl && avx512dq; }
  // Short ISA summary for logs and reports, e.g. "AVX-512 (F/BW/VL/DQ) +BF16", "AVX2+FMA".
  std::string isa() const;
  // FP32 FLOP per cycle per core of the widest FMA path: AVX-512 with two FMA units 64 (Intel
  // server cores, AMD Zen 5); AVX-512 on Zen 4, which splits 512-bit operations in two, and
  // AVX2+FMA with two units 32; AVX without FMA 16; SSE 8. An estimate: some Xeons have one
  // AVX-512 FMA unit.
  int fp32_flops_per_cycle() const;
  // min(threads, cores) × cpu_clock() × fp32_flops_per_cycle(); 0 when the clock is unknown.
  // An estimate: a core may boost above the clock it ran at when measured.
  double theoretical_peak_flops(int threads) const;
};

// Detects the features once per process; cheap to call again.
const CpuFeatures& cpu_features();

struct CpuClock {
  double hz = 0;       // 0 when unknown
  std::string source;  // "cpufreq max", or the higher of "/proc/cpuinfo cpu MHz" (a VM's
                       // nominal clock) and "measured, dependent adds"
};
// The core clock, found at the first call (a measurement of ~30 ms where the machine has no
// cpufreq), so that only a process that shows a theoretical peak pays for it.
const CpuClock& cpu_clock();

}  // namespace keel
