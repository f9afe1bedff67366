// cpu_sgemm_peak: measures once, then serves the number from its cache file, keyed by
// everything the rate depends on (CPU model, ISA, BLAS build and core, threads), so that a
// cache from another machine or another BLAS path is not believed.
#include "runtime/cpu/sgemm_peak.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "runtime/cpu/blas_core.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

class SgemmPeak : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_dir("sgemm_peak");
    const char* old = getenv("KEEL_CACHE_DIR");
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
    setenv("KEEL_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (had_old_) {
      setenv("KEEL_CACHE_DIR", old_.c_str(), 1);
    } else {
      unsetenv("KEEL_CACHE_DIR");
    }
  }
  std::string dir_, old_;
  bool had_old_ = false;
};

std::filesystem::path cache_file(const std::string& dir, int threads) {
  return std::filesystem::path(dir) / sgemm_peak_cache_name(sgemm_peak_cache_key(threads), threads);
}

std::string label(int threads) {
  return "measured SGEMM 2048^3, " + std::to_string(threads) +
         (threads == 1 ? " thread, " : " threads, ") + "OpenBLAS " + blas_path().core + ", " +
         cpu_features().model_name;
}

TEST(SgemmPeakKey, EveryInputChangesTheKeyAndTheFile) {
  const std::string base = sgemm_peak_cache_key("CPU", "AVX2+FMA", "OpenBLAS 0.3.21", "Haswell", 2);
  const std::set<std::string> keys = {
      base,
      sgemm_peak_cache_key("Other CPU", "AVX2+FMA", "OpenBLAS 0.3.21", "Haswell", 2),
      sgemm_peak_cache_key("CPU", "AVX-512 (F/BW/VL/DQ)", "OpenBLAS 0.3.21", "Haswell", 2),
      sgemm_peak_cache_key("CPU", "AVX2+FMA", "OpenBLAS 0.3.26", "Haswell", 2),
      sgemm_peak_cache_key("CPU", "AVX2+FMA", "OpenBLAS 0.3.21", "Prescott", 2),
      sgemm_peak_cache_key("CPU", "AVX2+FMA", "OpenBLAS 0.3.21", "Haswell", 1)};
  EXPECT_EQ(keys.size(), 6u);
  std::set<std::string> names;
  for (const auto& k : keys) names.insert(sgemm_peak_cache_name(k, 2));
  EXPECT_EQ(names.size(), 6u);
  EXPECT_EQ(sgemm_peak_cache_name(base, 2), sgemm_peak_cache_name(base, 2));  // stable
  EXPECT_EQ(sgemm_peak_cache_name(base, 2).rfind("sgemm_peak_2t_", 0), 0u);
  // This process's key names what it runs on.
  const std::string mine = sgemm_peak_cache_key(1);
  EXPECT_NE(mine.find(blas_path().core), std::string::npos) << mine;
  EXPECT_NE(mine.find(blas_path().config), std::string::npos) << mine;
  EXPECT_NE(mine.find(cpu_features().isa()), std::string::npos) << mine;
}

TEST_F(SgemmPeak, MeasuresThenServesFromTheCache) {
  PeakFlops first = cpu_sgemm_peak(1);
  EXPECT_GT(first.flops_per_s, 1e8);  // any CPU that runs keel does 0.1 GFLOP/s
  EXPECT_EQ(first.source.rfind(label(1), 0), 0u) << first.source;
  EXPECT_EQ(first.source.find("(cached)"), std::string::npos) << first.source;
  if (cpu_clock().hz > 0) {
    EXPECT_GT(first.theoretical_flops_per_s, 0);
    EXPECT_NE(first.theoretical_source.find("FLOP/cycle"), std::string::npos);
  }
  // Measured on a busy machine the number is not remembered; otherwise it is.
  const bool busy = first.source.find("(machine busy, not cached)") != std::string::npos;
  EXPECT_EQ(std::filesystem::exists(cache_file(dir_, 1)), !busy);
  if (!busy) {
    EXPECT_EQ(first.cache_file, cache_file(dir_, 1).string());
    PeakFlops second = cpu_sgemm_peak(1);
    EXPECT_EQ(second.flops_per_s, first.flops_per_s);
    EXPECT_EQ(second.source, first.source + " (cached)");
    forget_sgemm_peak(second);
    EXPECT_FALSE(std::filesystem::exists(cache_file(dir_, 1)));
  }
}

TEST_F(SgemmPeak, ReadsTheCacheOfThisKey) {
  {
    std::ofstream out(cache_file(dir_, 3));
    out << sgemm_peak_cache_key(3) << "\n1.25e11\n";
  }
  PeakFlops peak = cpu_sgemm_peak(3);
  EXPECT_EQ(peak.flops_per_s, 1.25e11);
  EXPECT_EQ(peak.source, label(3) + " (cached)");
}

// The stale cache of the issue: the same CPU, but the rate was measured on another core.
TEST_F(SgemmPeak, IgnoresACacheOfAnotherKey) {
  {
    std::ofstream out(cache_file(dir_, 1));
    out << sgemm_peak_cache_key(cpu_features().model_name, cpu_features().isa(), blas_path().config,
                                "NotThisCore", 1)
        << "\n1e20\n";
  }
  PeakFlops peak = cpu_sgemm_peak(1);
  EXPECT_LT(peak.flops_per_s, 1e20);
  EXPECT_EQ(peak.source.find("(cached)"), std::string::npos);
}

}  // namespace
}  // namespace keel
