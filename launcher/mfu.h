// The peak of model FLOPs utilisation (MFU = Trainer::model_flops_per_token() × tokens/s ÷
// peak), labelled with where it came from: on CPU a SGEMM rate measured on this machine
// (cached), on GPU the card's datasheet dense rate for the precision the job computes in.
#pragma once

#include <string>

#include "runtime/backend.h"

namespace keel {

struct Peak {
  double flops_per_s = 0;
  std::string source;
};

// CPU: measured SGEMM peak with `threads` threads. CUDA: datasheet rate of the backend's
// card (by name; unknown cards report 0 and say so).
Peak device_peak(Backend& backend, Precision precision, int threads);

}  // namespace keel
