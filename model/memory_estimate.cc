#include "model/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/job_layout.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/topology.h"

namespace keel {
namespace {

// Sizes are kept in double: a config of 10^5 layers of width 10^4 overflows no int64, but
// products of unchecked int32 fields could, and an estimate needs no exact byte count.
constexpr double kFloat = 4;
// The process itself, before its first buffer: keel, protobuf, OpenBLAS, thread stacks. A
// rank of the tiny test GPT peaks at 16 MiB with one thread; OpenBLAS adds buffers per
// thread. It is what bounds --nproc on a machine: 1000 ranks of nothing are still 1000
// processes.
constexpr double kProcessBytes = 32.0 * 1024 * 1024;

// "name: value" of the first line of `path` starting with `key`, in kB; < 0 if absent.
double meminfo_kb(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(key.size()));
  }
  return -1;
}

// The first number in a one-line sysfs file; < 0 if absent or "max".
double read_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return -1;
  try {
    return std::stod(word);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

std::string format_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

std::string MemoryEstimate::describe() const {
  std::ostringstream os;
  os << "parameters " << format_bytes(params) << ", gradients " << format_bytes(grads)
     << ", AdamW moments " << format_bytes(moments) << ", activations " << format_bytes(activations)
     << " (" << in_flight << " micro-batch" << (in_flight == 1 ? "" : "es")
     << " in flight), scratch " << format_bytes(scratch) << ", gradient buckets "
     << format_bytes(comm) << ", process " << format_bytes(process) << ", snapshot slots "
     << format_bytes(snapshot) << " (2 own" << (backup_slots ? " + 2 peer backup" : "")
     << (verified_slots ? " + verified (sdc)" : "") << ", shared memory)";
  return os.str();
}

MemoryEstimate estimate_rank_memory(const config::JobConfig& job, int pp_rank) {
  config::JobConfig cfg = job;
  {
    // The same derivation as proto/config_loader's fill_derived_defaults, repeated here so
    // that an estimate of an unfilled config is still right.
    auto* m = cfg.mutable_model();
    if (m->ffn_hidden_size() == 0) m->set_ffn_hidden_size(4 * m->hidden_size());
    if (m->padded_vocab_size() == 0) m->set_padded_vocab_size((m->vocab_size() + 127) / 128 * 128);
  }
  const auto& m = cfg.model();
  const auto& p = cfg.parallel();
  const double C = m.hidden_size(), F = m.ffn_hidden_size(), Vp = m.padded_vocab_size(),
               T = m.seq_len(), NH = m.num_heads(), tp = p.tp(), B = cfg.train().micro_batch_size();
  const double N = B * T;
  const bool first = pp_rank == 0, last = pp_rank == p.pp() - 1;
  const double layers = stage_layer_counts(cfg).at(size_t(pp_rank));

  MemoryEstimate e;
  e.pp_rank = pp_rank;
  // Parameters of one layer's TP shard: LayerNorms and row-parallel biases are replicated,
  // the column/row-parallel weights and column biases split.
  const double per_layer =
      4 * C + (3 * C * C + 3 * C) / tp + C * C / tp + C + (F * C + F) / tp + C * F / tp + C;
  double n = layers * per_layer;
  if (first) n += Vp * C / tp + T * C;       // wte shard, wpe
  if (last) n += 2 * C;                      // lnf
  if (last && p.pp() > 1) n += Vp * C / tp;  // the head's copy of the tied wte
  e.params = n * kFloat;
  e.grads = e.params;
  e.moments = 2 * e.params / (p.zero1() && p.dp() > 1 ? p.dp() : 1);

  // Activations of one micro-batch (model/gpt/gpt_layout.cc), N = B·T rows.
  const double att = B * (NH / tp) * T * T;
  double act = layers * (2 * N * C + 4 * N + 3 * N * C / tp + N * C / tp + att + 2 * N * C +
                         2 * N * F / tp + N * C);
  if (first) act += N * C;
  if (last) act += N * C + 2 * N + N * Vp / tp;
  act *= kFloat;
  act += 2 * N * 4;                   // tokens and targets (int32)
  if (!first) act += N * C * kFloat;  // the input received from the previous stage
  const int micro_batches =
      std::max(1, cfg.train().global_batch_size() /
                      std::max(1, cfg.train().micro_batch_size() * std::max(1, p.dp())));
  e.in_flight = max_in_flight(pp_rank, p.pp(), micro_batches);
  e.activations = e.in_flight * act;

  // Scratch of one call: the backward's dres, dln and the larger of the MLP's and the
  // attention's gradients; the stage output and its gradient; the input's gradient.
  double scratch = std::max(N, 2 * N * C + std::max(2 * N * F / tp, 4 * N * C / tp + att));
  if (!last) scratch += 2 * N * C;
  if (!first) scratch += N * C;
  e.scratch = scratch * kFloat;
  if (p.dp() > 1) e.comm = 2 * double(p.bucket_mb()) * 1024 * 1024;
  e.process = kProcessBytes;
  if (cfg.checkpoint().snapshot_every_step()) {
    // Backups are pushed unless DP replicas hold them (ckpt/backup_placement.h).
    const bool alone = p.dp() * p.pp() * p.tp() == 1, replicas = !p.zero1() && p.dp() > 1;
    e.backup_slots = alone || replicas ? 0 : 2;
    // The verified slot of the SDC checks, and its pushed copy where backups are pushed.
    e.verified_slots = cfg.sdc().check_every_steps() > 0 ? (e.backup_slots ? 2 : 1) : 0;
    e.snapshot = double(2 + e.backup_slots + e.verified_slots) * (e.params + e.moments);
  }
  return e;
}

AvailableMemory available_host_memory() {
  AvailableMemory a;
  double kb = meminfo_kb("/proc/meminfo", "MemAvailable:");
  if (kb < 0) {
    a.bytes = -1;
    a.source = "unknown (no MemAvailable in /proc/meminfo)";
    return a;
  }
  a.bytes = kb * 1024;
  a.source = "MemAvailable in /proc/meminfo";
  // In a container the cgroup's limit, not the machine's free memory, decides the OOM kill.
  double max = read_number("/sys/fs/cgroup/memory.max");
  double current = read_number("/sys/fs/cgroup/memory.current");
  if (max >= 0 && current >= 0 && max - current < a.bytes) {
    a.bytes = std::max(0.0, max - current);
    a.source = "memory.max - memory.current of this cgroup (/sys/fs/cgroup)";
  }
  return a;
}

void check_memory_fits(const config::JobConfig& cfg, int first_rank, int num_ranks,
                       const AvailableMemory& available) {
  const auto& p = cfg.parallel();
  Topology topo(p.tp(), p.pp(), p.dp());
  const bool cuda = cfg.runtime().device() == config::RuntimeConfig::cuda;
  std::vector<MemoryEstimate> stages;
  for (int s = 0; s < p.pp(); ++s) stages.push_back(estimate_rank_memory(cfg, s));
  auto host_bytes = [&](const MemoryEstimate& e) { return e.host_bytes(cuda); };
  double need = 0;
  int worst = 0;
  for (int r = first_rank; r < first_rank + num_ranks && r < topo.world_size(); ++r) {
    const int s = topo.coord(r).pp;
    need += host_bytes(stages[size_t(s)]);
    if (host_bytes(stages[size_t(s)]) > host_bytes(stages[size_t(worst)])) worst = s;
  }
  if (available.bytes < 0 || need <= available.bytes) return;
  const auto& m = cfg.model();
  throw InputError(detail::concat(
      "the job does not fit in memory: its ", num_ranks, " rank(s) on this machine need an ",
      "estimated ", format_bytes(need), " of host memory",
      cuda ? " (snapshot slots; device "
             "memory is checked when it is allocated)"
           : "",
      ", ", format_bytes(available.bytes), " available (", available.source,
      ")\n  largest rank (pipeline stage ", worst, " of ", p.pp(), "): ",
      stages[size_t(worst)].describe(), "\n  to shrink it: model.num_layers = ", m.num_layers(),
      ", model.hidden_size = ", m.hidden_size(), ", model.seq_len = ", m.seq_len(),
      ", train.micro_batch_size = ", cfg.train().micro_batch_size(),
      "; more stages or shards (parallel.pp, parallel.tp, "
      "parallel.zero1); or checkpoint.snapshot_every_step = false"));
}

}  // namespace keel
