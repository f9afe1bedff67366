// The OpenBLAS core ranking and the decision to re-execute with a better one: pure functions,
// so every case a CPU of another vendor or a user's variable produces is tested here.
#include "runtime/cpu/blas_core.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace keel {
namespace {

TEST(BlasCoreRank, OrdersCoresByTheirVectorIsa) {
  EXPECT_LT(blas_core_rank("Katmai"), blas_core_rank("Prescott"));
  EXPECT_LE(blas_core_rank("Prescott"), blas_core_rank("Nehalem"));
  EXPECT_LT(blas_core_rank("Prescott"), blas_core_rank("Sandybridge"));
  EXPECT_LT(blas_core_rank("Sandybridge"), blas_core_rank("Haswell"));
  EXPECT_EQ(blas_core_rank("Haswell"), blas_core_rank("Zen"));
  EXPECT_LT(blas_core_rank("Haswell"), blas_core_rank("SkylakeX"));
  EXPECT_LT(blas_core_rank("SkylakeX"), blas_core_rank("Cooperlake"));
  EXPECT_LT(blas_core_rank("Cooperlake"), blas_core_rank("SapphireRapids"));
  EXPECT_EQ(blas_core_rank("Pentium9000"), -1);
}

TEST(BlasCoreRank, IgnoresCaseAsOpenblasCoretypeDoes) {
  EXPECT_EQ(blas_core_rank("skylakex"), blas_core_rank("SkylakeX"));
  EXPECT_EQ(canonical_blas_core("COOPERLAKE"), "Cooperlake");
  EXPECT_EQ(canonical_blas_core("nonsense"), "");
}

CpuFeatures features(const std::string& vendor, bool avx2, bool avx512, bool bf16) {
  CpuFeatures f;
  f.vendor = vendor;
  f.avx = f.fma = f.avx2 = avx2;
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = avx512;
  f.avx512_bf16 = bf16;
  return f;
}

TEST(BestBlasCore, FollowsTheIsa) {
  EXPECT_EQ(best_blas_core(features("GenuineIntel", true, true, true)), "Cooperlake");
  EXPECT_EQ(best_blas_core(features("GenuineIntel", true, true, false)), "SkylakeX");
  EXPECT_EQ(best_blas_core(features("AuthenticAMD", true, true, true)), "Cooperlake");
  EXPECT_EQ(best_blas_core(features("GenuineIntel", true, false, false)), "Haswell");
  EXPECT_EQ(best_blas_core(features("AuthenticAMD", true, false, false)), "Zen");
  EXPECT_EQ(best_blas_core(features("GenuineIntel", false, false, false)), "");
  // AVX-512F alone (Knights Landing) lacks BW/VL/DQ, which SkylakeX's kernels use.
  CpuFeatures knl = features("GenuineIntel", true, false, false);
  knl.avx512f = true;
  EXPECT_EQ(best_blas_core(knl), "Haswell");
}

BlasCoreInputs inputs(const std::string& loaded, const std::string& best) {
  BlasCoreInputs in;
  in.loaded = loaded;
  in.best = best;
  return in;
}

// The machine: Intel family 6 model 207, which OpenBLAS 0.3.21 does not know.
TEST(DecideBlasCore, ReexecutesWhenOpenblasChoseLess) {
  BlasCoreDecision d = decide_blas_core(inputs("Prescott", "Cooperlake"));
  EXPECT_EQ(d.reexec_with, "Cooperlake");
  // The process after the re-exec: keel's variable, the right core, nothing more to do.
  BlasCoreInputs after = inputs("Cooperlake", "Cooperlake");
  after.env_coretype = after.env_marker = "Cooperlake";
  d = decide_blas_core(after);
  EXPECT_EQ(d.reexec_with, "");
  EXPECT_EQ(d.chosen_by, "keel");
  EXPECT_EQ(d.note, "");
}

TEST(DecideBlasCore, KeepsOpenblasChoiceWhenItIsTheBestOrBetter) {
  BlasCoreDecision d = decide_blas_core(inputs("Cooperlake", "Cooperlake"));
  EXPECT_EQ(d.reexec_with, "");
  EXPECT_EQ(d.chosen_by, "OpenBLAS");
  EXPECT_EQ(decide_blas_core(inputs("Zen", "Haswell")).reexec_with, "");  // equal rank
  EXPECT_EQ(decide_blas_core(inputs("SapphireRapids", "Cooperlake")).reexec_with, "");
  EXPECT_EQ(decide_blas_core(inputs("Prescott", "")).reexec_with, "");  // no better core
}

TEST(DecideBlasCore, RespectsTheUsersVariableAndSaysWhatKeelWouldChoose) {
  BlasCoreInputs in = inputs("Prescott", "SkylakeX");
  in.env_coretype = "Prescott";
  BlasCoreDecision d = decide_blas_core(in);
  EXPECT_EQ(d.reexec_with, "");
  EXPECT_EQ(d.chosen_by, "OPENBLAS_CORETYPE");
  EXPECT_NE(d.note.find("keel would choose SkylakeX"), std::string::npos) << d.note;
  // A variable keel set for another core (an agent's) but the user overrode: still the user's.
  in.env_marker = "SkylakeX";
  EXPECT_EQ(decide_blas_core(in).chosen_by, "OPENBLAS_CORETYPE");
}

TEST(DecideBlasCore, TheConfigNamesACoreWhateverTheVariableSays) {
  BlasCoreInputs in = inputs("Cooperlake", "Cooperlake");
  in.requested = "haswell";
  EXPECT_EQ(decide_blas_core(in).reexec_with, "Haswell");
  in.env_coretype = "Prescott";  // the user's variable loses to the job's config
  EXPECT_EQ(decide_blas_core(in).reexec_with, "Haswell");
  BlasCoreInputs after = inputs("Haswell", "Cooperlake");
  after.requested = "Haswell";
  after.env_coretype = after.env_marker = "Haswell";
  BlasCoreDecision d = decide_blas_core(after);
  EXPECT_EQ(d.reexec_with, "");
  EXPECT_EQ(d.chosen_by, "runtime.blas_core");
}

TEST(DecideBlasCore, NeverLoopsWhenOpenblasIgnoresTheVariable) {
  // Asked for Haswell at load and still on Prescott: re-executing again would change nothing.
  BlasCoreInputs in = inputs("Prescott", "Haswell");
  in.requested = "Haswell";
  in.env_coretype = in.env_marker = "Haswell";
  BlasCoreDecision d = decide_blas_core(in);
  EXPECT_EQ(d.reexec_with, "");
  EXPECT_NE(d.note.find("ignored"), std::string::npos) << d.note;
  // The same for "auto": keel's own variable is already there.
  in.requested = "auto";
  d = decide_blas_core(in);
  EXPECT_EQ(d.reexec_with, "");
  EXPECT_EQ(d.chosen_by, "keel");
  EXPECT_NE(d.note.find("OpenBLAS runs Prescott"), std::string::npos) << d.note;
}

TEST(DecideBlasCore, ABuildWithoutDynamicArchCannotSwitch) {
  BlasCoreInputs in = inputs("Prescott", "SkylakeX");
  in.dynamic_arch = false;
  BlasCoreDecision d = decide_blas_core(in);
  EXPECT_EQ(d.reexec_with, "");
  EXPECT_NE(d.note.find("DYNAMIC_ARCH"), std::string::npos) << d.note;
}

TEST(AddBlasCoreEnv, LeavesAnEnvironmentThatAlreadyNamesACore) {
  std::map<std::string, std::string> env{{"OPENBLAS_CORETYPE", "Haswell"}};
  add_blas_core_env(&env);
  EXPECT_EQ(env.size(), 1u);
  EXPECT_EQ(env["OPENBLAS_CORETYPE"], "Haswell");
}

// CPUID agrees with the kernel's reading of it (/proc/cpuinfo flags).
TEST(CpuFeatures, AgreeWithProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  if (flags.empty()) GTEST_SKIP() << "no flags in /proc/cpuinfo";
  auto has = [&](const std::string& f) { return flags.find(" " + f + " ") != std::string::npos; };
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(f.avx2, has("avx2"));
  EXPECT_EQ(f.fma, has("fma"));
  EXPECT_EQ(f.avx512f, has("avx512f"));
  EXPECT_EQ(f.avx512bw, has("avx512bw"));
  EXPECT_EQ(f.avx512vl, has("avx512vl"));
  EXPECT_EQ(f.avx512dq, has("avx512dq"));
  EXPECT_EQ(f.avx512_bf16, has("avx512_bf16"));
  EXPECT_EQ(f.amx_tile, has("amx_tile"));
  EXPECT_GE(f.cores, 1);
  EXPECT_NE(f.describe().find(f.vendor + " family " + std::to_string(f.family)), std::string::npos)
      << f.describe();
  EXPECT_FALSE(f.isa().empty());
  EXPECT_GE(f.fp32_flops_per_cycle(), 8);
  if (cpu_clock().hz > 0) {
    EXPECT_EQ(f.theoretical_peak_flops(1), cpu_clock().hz * f.fp32_flops_per_cycle());
  }
}

}  // namespace
}  // namespace keel
