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

TEST_F(SgemmPeak, MeasuresOnceThenReadsTheCache) {
  PeakFlops first = cpu_sgemm_peak(1);
  EXPECT_GT(first.flops_per_s, 1e8);  // any CPU that runs keel does 0.1 GFLOP/s
  EXPECT_NE(first.source.find("measured SGEMM"), std::string::npos) << first.source;
  EXPECT_NE(first.source.find("1 thread"), std::string::npos) << first.source;
  EXPECT_EQ(first.source.find("(cached)"), std::string::npos) << first.source;
  const std::filesystem::path file = std::filesystem::path(dir_) / "sgemm_peak_1t.txt";
  ASSERT_TRUE(std::filesystem::exists(file));

  PeakFlops second = cpu_sgemm_peak(1);
  EXPECT_EQ(second.flops_per_s, first.flops_per_s);
  EXPECT_EQ(second.source, first.source + " (cached)");
}

TEST_F(SgemmPeak, IgnoresACacheWrittenOnAnotherCpu) {
  const std::filesystem::path file = std::filesystem::path(dir_) / "sgemm_peak_1t.txt";
  {
    std::ofstream out(file);
    out << "Some Other CPU\n1e20\n";
  }
  PeakFlops peak = cpu_sgemm_peak(1);
  EXPECT_LT(peak.flops_per_s, 1e20);
  EXPECT_EQ(peak.source.find("(cached)"), std::string::npos);
  // The file now holds this CPU's number.
  EXPECT_EQ(cpu_sgemm_peak(1).flops_per_s, peak.flops_per_s);
}

}  // namespace
}  // namespace keel
