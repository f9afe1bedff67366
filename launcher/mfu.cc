#include "launcher/mfu.h"

#include "runtime/cpu/sgemm_peak.h"

namespace keel {

Peak device_peak(Backend& backend, Precision precision, int threads) {
  if (backend.kind() == DeviceKind::kCpu) {
    PeakFlops p = cpu_sgemm_peak(threads);
    return {p.flops_per_s, p.source};
  }
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
      return {bf16 ? c.bf16 : c.fp32,
              std::string("datasheet dense ") + (bf16 ? "bf16" : "fp32") + " rate of " + c.name};
    }
  return {0, "unknown card '" + name + "': no datasheet peak"};
}

}  // namespace keel
