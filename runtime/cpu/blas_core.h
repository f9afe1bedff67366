// Which OpenBLAS kernels ("core") keel runs on, and making sure it is the best this OpenBLAS
// has for the CPU. A DYNAMIC_ARCH OpenBLAS picks its core from the CPU model at load time;
// a model newer than the library (Debian's 0.3.21 on an Intel family 6 model 207 Xeon) falls
// back to Prescott's SSE3 kernels, 5× slower than the AVX-512 ones the CPU can run. The
// library reads OPENBLAS_CORETYPE only when it loads, so a process that wants another core
// sets the variable and executes itself again (select_blas_core), and a launcher sets it for
// the workers it starts (add_blas_core_env).
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "runtime/cpu/cpu_features.h"

namespace keel {

// The x86-64 cores of OpenBLAS's DYNAMIC_ARCH builds, ranked by the vector ISA their kernels
// use: 1 SSE/SSE2, 2 SSE3/SSE4, 3 AVX, 4 AVX2+FMA (Haswell = Zen), 5 AVX-512 (SkylakeX),
// 6 AVX-512 + BF16 (Cooperlake), 7 AMX (SapphireRapids, newer than 0.3.21). -1: a name this
// table does not know. Case-insensitive, as OPENBLAS_CORETYPE is. Inline so that the config
// validation can use it without linking the runtime.
inline int blas_core_rank(std::string_view core);
// The table's spelling of `core` ("skylakex" → "SkylakeX"), "" if unknown.
inline std::string_view canonical_blas_core(std::string_view core);

// The best core OpenBLAS 0.3.21 has for `cpu`: Cooperlake with AVX-512 BF16, SkylakeX with
// AVX-512 F/BW/VL/DQ, Haswell (Intel) or Zen (AMD) with AVX2+FMA; "" below that (whatever
// OpenBLAS picks is as good as any).
std::string best_blas_core(const CpuFeatures& cpu);

// What decide_blas_core looks at. Empty strings mean "unset".
struct BlasCoreInputs {
  std::string loaded;              // openblas_get_corename() of this process
  std::string best;                // best_blas_core(cpu_features())
  std::string requested = "auto";  // runtime.blas_core: "auto" or a core name
  std::string env_coretype;        // OPENBLAS_CORETYPE as this process found it
  std::string env_marker;          // KEEL_BLAS_CORE: the core keel itself set OPENBLAS_CORETYPE to
  bool dynamic_arch = true;  // the OpenBLAS config says DYNAMIC_ARCH (else the variable is inert)
};

struct BlasCoreDecision {
  std::string reexec_with;  // non-empty: set OPENBLAS_CORETYPE to this and execute again
  // Who chose the loaded core: "OpenBLAS" (its own CPU detection), "keel" (this decision, on
  // an earlier exec or in the launcher), "OPENBLAS_CORETYPE" (the user's variable),
  // "runtime.blas_core" (the config).
  std::string chosen_by;
  std::string note;  // a warning for stderr ("" if none), e.g. what keel would have chosen
};

// The pure decision. With "auto", a core below `best` is replaced by `best` unless the user
// set OPENBLAS_CORETYPE (respected, with a note); a named core replaces any other. Never asks
// to re-execute with the OPENBLAS_CORETYPE the process already has, so it cannot loop.
BlasCoreDecision decide_blas_core(const BlasCoreInputs& in);

// The BLAS path of this process, for logs and the run report.
struct BlasPath {
  std::string config;     // openblas_get_config(), e.g. "OpenBLAS 0.3.21 ... DYNAMIC_ARCH ..."
  std::string core;       // openblas_get_corename(), e.g. "Cooperlake"
  std::string best;       // best_blas_core(), "" if none
  std::string chosen_by;  // see BlasCoreDecision
  std::string note;
};

// keel-worker's start: decides for `requested` (runtime.blas_core) and, if the process should
// run another core, sets OPENBLAS_CORETYPE and KEEL_BLAS_CORE and executes /proc/self/exe
// with `argv` (does not return). Otherwise returns the path it runs on, and prints the
// decision's note, if any, to stderr. Call before any thread of keel's starts (setenv).
BlasPath select_blas_core(const std::string& requested, char** argv);

// The path this process runs on: the one select_blas_core returned, else decided for "auto".
BlasPath blas_path();

// A launcher about to start workers: adds OPENBLAS_CORETYPE (and KEEL_BLAS_CORE) to their
// environment when this process's OpenBLAS chose less than the best core and neither `env`
// nor this process's environment sets the variable, so that the workers need no re-exec.
void add_blas_core_env(std::map<std::string, std::string>* env);

// ---- inline definitions ----

namespace blas_core_detail {
struct Core {
  std::string_view name;
  int rank;
};
inline constexpr Core kCores[] = {
    {"Unknown", 0},       {"Katmai", 1},       {"Coppermine", 1},  {"Northwood", 1},
    {"Banias", 1},        {"Atom", 1},         {"Opteron", 1},     {"Bobcat", 1},
    {"Prescott", 2},      {"Opteron_SSE3", 2}, {"Core2", 2},       {"Penryn", 2},
    {"Dunnington", 2},    {"Nehalem", 2},      {"Barcelona", 2},   {"Sandybridge", 3},
    {"Bulldozer", 3},     {"Piledriver", 3},   {"Steamroller", 3}, {"Excavator", 3},
    {"Haswell", 4},       {"Zen", 4},          {"SkylakeX", 5},    {"Cooperlake", 6},
    {"SapphireRapids", 7}};
inline bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = char(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = char(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}
}  // namespace blas_core_detail

inline int blas_core_rank(std::string_view core) {
  for (const auto& c : blas_core_detail::kCores)
    if (blas_core_detail::iequal(c.name, core)) return c.rank;
  return -1;
}

inline std::string_view canonical_blas_core(std::string_view core) {
  for (const auto& c : blas_core_detail::kCores)
    if (blas_core_detail::iequal(c.name, core)) return c.name;
  return {};
}

}  // namespace keel
