// keel-worker's command line. Rank, world size and store address may also come from the
// environment (KEEL_RANK, KEEL_WORLD_SIZE, KEEL_STORE_ADDR), which is how --nproc and,
// later, keel-launch start workers.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace keel {

struct WorkerOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set path=value, in order
  std::string report_path;             // --report FILE (JSON, written by rank 0)
  std::string export_llmc_path;        // --export-llmc FILE (written by rank 0)
  std::string loss_svg_path;           // --loss-svg FILE (loss curve, written by rank 0)
  int nproc = 0;                       // --nproc N: start N local ranks and supervise them
  int rank = 0, world_size = 1;        // --rank/--world or KEEL_RANK/KEEL_WORLD_SIZE
  std::string store_addr;              // --store HOST:PORT or KEEL_STORE_ADDR
  int local_world_size = 1;            // KEEL_LOCAL_WORLD_SIZE: ranks sharing this machine
  bool quiet = false;                  // --quiet: no per-step lines
  std::vector<std::string> faults;     // --fault KIND@step=S,rank=R,... (robust/fault_spec.h)
  std::string inject_path;             // --inject FILE: a fault schedule (text protobuf)
  std::string resume_dir;              // --resume DIR: continue from a persistent checkpoint
};

// Parses argv and the environment (CLI11, runtime/cli.h). Returns nothing to go on, or the
// exit status to end with: 0 after --help, 2 (recovery::kExitInputError) after a usage error,
// which it has reported on stderr as "keel-worker: error: ..." naming the flag or variable.
std::optional<int> parse_worker_options(int argc, char** argv, WorkerOptions* out);

// The generated --help text.
std::string worker_usage();

}  // namespace keel
