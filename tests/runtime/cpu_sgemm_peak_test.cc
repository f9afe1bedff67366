// cpu_sgemm_peak: measures once, then serves the number from its cache file, keyed by the CPU
// model so that a cache copied from another machine is not believed.
#include "runtime/cpu/sgemm_peak.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

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
  return std::filesystem::path(dir) / ("sgemm_peak_" + std::to_string(threads) + "t.txt");
}

TEST_F(SgemmPeak, MeasuresThenServesFromTheCache) {
  PeakFlops first = cpu_sgemm_peak(1);
  EXPECT_GT(first.flops_per_s, 1e8);  // any CPU that runs keel does 0.1 GFLOP/s
  EXPECT_NE(first.source.find("measured SGEMM 1536^3, 1 thread, " + cpu_model_name()),
            std::string::npos)
      << first.source;
  EXPECT_EQ(first.source.find("(cached)"), std::string::npos) << first.source;
  // Measured on a busy machine the number is not remembered; otherwise it is.
  const bool busy = first.source.find("(machine busy, not cached)") != std::string::npos;
  EXPECT_EQ(std::filesystem::exists(cache_file(dir_, 1)), !busy);
  if (!busy) {
    PeakFlops second = cpu_sgemm_peak(1);
    EXPECT_EQ(second.flops_per_s, first.flops_per_s);
    EXPECT_EQ(second.source, first.source + " (cached)");
  }
}

TEST_F(SgemmPeak, ReadsTheCacheOfThisCpuAndThreadCount) {
  {
    std::ofstream out(cache_file(dir_, 3));
    out << cpu_model_name() << "\n1.25e11\n";
  }
  PeakFlops peak = cpu_sgemm_peak(3);
  EXPECT_EQ(peak.flops_per_s, 1.25e11);
  EXPECT_EQ(peak.source, "measured SGEMM 1536^3, 3 threads, " + cpu_model_name() + " (cached)");
}

TEST_F(SgemmPeak, IgnoresACacheWrittenOnAnotherCpu) {
  {
    std::ofstream out(cache_file(dir_, 1));
    out << "Some Other CPU\n1e20\n";
  }
  PeakFlops peak = cpu_sgemm_peak(1);
  EXPECT_LT(peak.flops_per_s, 1e20);
  EXPECT_EQ(peak.source.find("(cached)"), std::string::npos);
}

}  // namespace
}  // namespace keel
