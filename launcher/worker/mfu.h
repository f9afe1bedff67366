// The peak of model FLOPs utilisation (MFU = Trainer::model_flops_per_token() × tokens/s ÷
// peak), labelled with where it came from: on CPU a SGEMM rate measured on this machine
// (cached, see runtime/cpu/sgemm_peak.h) next to the cores' theoretical rate, on GPU the
// card's datasheet dense rate for the precision the job computes in.
#pragma once

#include <string>

#include "runtime/backend.h"
#include "runtime/cpu/sgemm_peak.h"

namespace keel {

// The CPU's PeakFlops; a GPU's has the datasheet rate as its theoretical one too and no cache.
using Peak = PeakFlops;

// CPU: measured SGEMM peak with `threads` threads. CUDA: datasheet rate of the backend's
// card (by name; unknown cards report 0 and say so).
Peak device_peak(Backend& backend, Precision precision, int threads);

// An MFU keel is willing to print. A model cannot compute faster than the GEMM it is made of,
// so a figure above 100% means the peak is wrong (measured on another path and cached):
// then `valid` is false, `value` 0 and `why_not` names the peak; likewise without a peak.
struct Mfu {
  double value = 0;  // a fraction, 0 when !valid
  bool valid = false;
  std::string
      why_not;  // e.g. "MFU n/a: 128% of the measured peak 241 GFLOP/s (...), which is stale..."
};
Mfu honest_mfu(double model_flops_per_s, const Peak& peak);

// Removes a stale peak's cache (the next start measures again); no-op without one.
void forget_peak(const Peak& peak);

// A rank's peak and its MFU against it: the first figure refused while there is a peak means
// the peak is stale, so it is named (logged) and its cache dropped, once.
class MfuGauge {
 public:
  MfuGauge() = default;
  explicit MfuGauge(Peak peak) : peak_(std::move(peak)) {}
  const Peak& peak() const { return peak_; }
  // honest_mfu() of `model_flops_per_s`.
  Mfu measure(double model_flops_per_s);
  // Whether the peak was found stale (and its cache dropped).
  bool refused() const { return refused_; }

 private:
  Peak peak_;
  bool refused_ = false;
};

}  // namespace keel
