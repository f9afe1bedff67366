#include "launcher/worker/mfu.h"

#include <cstdio>

#include "runtime/logging.h"

namespace keel {

Peak device_peak(Backend& backend, Precision precision, int threads) {
  if (backend.kind() == DeviceKind::kCpu) return cpu_sgemm_peak(threads);
  // Dense (no sparsity) tensor-core rates from NVIDIA's datasheets; fp32 is the non-tensor
  // FP32 rate, since keel's fp32 mode does not allow TF32.
  struct Card {
    const char* name;
    double bf16, fp32;
  };
  static const Card cards[] = {{"H200", 989e12, 67e12},
                               {"H100", 989e12, 67e12},
                               {"A100", 312e12, 19.5e12},
                               {"L40S", 362e12, 91.6e12}};
  const std::string name = backend.name();
  for (const Card& c : cards)
    if (name.find(c.name) != std::string::npos) {
      bool bf16 = precision == Precision::kBf16;
      const double rate = bf16 ? c.bf16 : c.fp32;
      std::string source =
          std::string("datasheet dense ") + (bf16 ? "bf16" : "fp32") + " rate of " + c.name;
      return {rate, source, rate, source, ""};
    }
  return {0, "unknown card '" + name + "': no datasheet peak", 0, "", ""};
}

Mfu honest_mfu(double model_flops_per_s, const Peak& peak) {
  Mfu m;
  if (!(peak.flops_per_s > 0)) {
    m.why_not = "MFU n/a: no peak (" + peak.source + ")";
    return m;
  }
  const double v = model_flops_per_s / peak.flops_per_s;
  if (v > 1.0) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "MFU n/a: %.0f%% of the measured peak %.0f GFLOP/s", 100 * v,
                  peak.flops_per_s / 1e9);
    // The model ran faster than the GEMM it is made of: the peak is wrong, not the model.
    const bool busy = peak.source.find("busy") != std::string::npos;
    m.why_not = std::string(buf) + " (" + peak.source + "), which is " +
                (busy ? "too low: measured while other work had the cores"
                      : "stale: measured on another path");
    return m;
  }
  m.value = v;
  m.valid = true;
  return m;
}

void forget_peak(const Peak& peak) {
  forget_sgemm_peak(peak);
}

Mfu MfuGauge::measure(double model_flops_per_s) {
  const Mfu m = honest_mfu(model_flops_per_s, peak_);
  if (!m.valid && peak_.flops_per_s > 0 && model_flops_per_s > 0 && !refused_) {
    refused_ = true;  // once: name the stale peak and make the next start measure
    LOG(WARNING) << m.why_not << "; its cache is dropped";
    forget_peak(peak_);
  }
  return m;
}

}  // namespace keel
