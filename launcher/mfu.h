// Model FLOPs utilisation: model FLOPs per token (6·N + 12·L·d·T for the GPT, the PaLM
// accounting llm.c uses) × tokens/s ÷ peak. The peak is labelled with where it came from:
// on CPU a SGEMM rate measured on this machine (cached), on GPU the card's datasheet dense
// rate for the precision the job computes in.
#pragma once

#include <cstdint>
#include <string>

#include "model/plugin.h"
#include "runtime/backend.h"

namespace keel {

struct Peak {
  double flops_per_s = 0;
  std::string source;
};

double flops_per_token(const keel_model_dims& dims, int64_t num_params);

// CPU: measured SGEMM peak with `threads` threads. CUDA: datasheet rate of the backend's
// card (by name; unknown cards report 0 and say so).
Peak device_peak(Backend& backend, Precision precision, int threads);

}  // namespace keel
