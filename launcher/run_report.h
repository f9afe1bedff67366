// What a training run reports: the JSON file of --report (for tests, benchmarks and later
// tools) and the loss curve of --loss-svg (for a person).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace keel {

struct RunReport {
  std::string plugin, plugin_version, backend, layout;  // layout e.g. "tp2 pp2 dp2"
  int world_size = 1;
  int64_t num_params = 0;
  int64_t steps_completed = 0;
  double final_loss = 0;
  std::string param_checksum;  // 16 hex digits
  double tokens_per_s = 0, mfu = 0, mfu_peak_flops = 0;
  std::string mfu_peak_source;
  double wall_s = 0;
  std::vector<double> losses, grad_norms, lrs;
  std::vector<double> val_steps, val_losses;  // train.eval_every: after which step, and the loss
  // Totals over steps of rank 0's time split and bytes sent per communicator.
  double compute_s = 0, comm_s = 0, bubble_s = 0;
  uint64_t bytes_tp = 0, bytes_pp = 0, bytes_dp = 0, bytes_emb = 0;
};

void write_report_json(const std::string& path, const RunReport& r);

// A self-contained SVG line chart of the losses by step.
void write_loss_svg(const std::string& path, const RunReport& r);

// FNV-1a 64 over each tensor's name and float bytes, in the order given: a digest of the
// parameters that does not depend on the parallel layout.
class ParamDigest {
 public:
  void add(const std::string& name, const std::vector<float>& values);
  std::string hex() const;

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace keel
