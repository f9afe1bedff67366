// honest_mfu: an MFU above 100% is never printed; the reason names the peak that is wrong.
#include "launcher/worker/mfu.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/test_paths.h"

namespace keel {
namespace {

Peak cpu_peak(double flops, const std::string& source) {
  Peak p;
  p.flops_per_s = flops;
  p.source = source;
  return p;
}

TEST(HonestMfu, IsTheRatioUpToOneHundredPercent) {
  const Peak p = cpu_peak(400e9, "measured SGEMM 2048^3, 2 threads, OpenBLAS Cooperlake, X");
  Mfu m = honest_mfu(200e9, p);
  EXPECT_TRUE(m.valid);
  EXPECT_DOUBLE_EQ(m.value, 0.5);
  EXPECT_EQ(m.why_not, "");
  m = honest_mfu(400e9, p);  // exactly the peak: possible in principle
  EXPECT_TRUE(m.valid);
  EXPECT_DOUBLE_EQ(m.value, 1.0);
}

// The case: 241 GFLOP/s cached from another path, the model doing 309.
TEST(HonestMfu, RefusesAFigureAboveOneHundredPercentAndNamesThePeak) {
  const Peak p = cpu_peak(241e9, "measured SGEMM 2048^3, 2 threads, OpenBLAS Prescott, X (cached)");
  const Mfu m = honest_mfu(309e9, p);
  EXPECT_FALSE(m.valid);
  EXPECT_EQ(m.value, 0);
  EXPECT_NE(m.why_not.find("MFU n/a: 128% of the measured peak 241 GFLOP/s"), std::string::npos)
      << m.why_not;
  EXPECT_NE(m.why_not.find(p.source), std::string::npos) << m.why_not;
  EXPECT_NE(m.why_not.find("stale"), std::string::npos) << m.why_not;
  // Measured while the machine was busy: too low, not stale.
  const Mfu busy = honest_mfu(
      309e9, cpu_peak(241e9, "measured SGEMM 2048^3, 2 threads, X (machine busy, not cached)"));
  EXPECT_FALSE(busy.valid);
  EXPECT_NE(busy.why_not.find("busy"), std::string::npos) << busy.why_not;
}

TEST(HonestMfu, WithoutAPeakThereIsNoFigure) {
  const Mfu m = honest_mfu(1e9, cpu_peak(0, "unknown card 'X': no datasheet peak"));
  EXPECT_FALSE(m.valid);
  EXPECT_EQ(m.value, 0);
  EXPECT_NE(m.why_not.find("no datasheet peak"), std::string::npos) << m.why_not;
}

TEST(ForgetPeak, RemovesTheCachedRate) {
  const std::string dir = test::temp_dir("forget_peak");
  Peak p = cpu_peak(1e9, "x");
  p.cache_file = dir + "/sgemm_peak_2t_0123456789abcdef.txt";
  std::ofstream(p.cache_file) << "key\n1e9\n";
  ASSERT_TRUE(std::filesystem::exists(p.cache_file));
  forget_peak(p);
  EXPECT_FALSE(std::filesystem::exists(p.cache_file));
  forget_peak(cpu_peak(1e9, "no cache"));  // harmless
}

// A rank's gauge: a figure above the peak names the stale peak and drops its cache once;
// figures it can vouch for pass, and without a peak nothing is dropped.
TEST(MfuGauge, AStalePeakIsDroppedOnce) {
  const std::string dir = test::temp_dir("mfu_gauge");
  Peak p = cpu_peak(100e9, "measured SGEMM 2048^3, 2 threads, X (cached)");
  p.cache_file = dir + "/sgemm_peak_2t_fedcba9876543210.txt";
  std::ofstream(p.cache_file) << "key\n1e11\n";
  MfuGauge g(p);
  EXPECT_TRUE(g.measure(50e9).valid);
  EXPECT_FALSE(g.refused());
  EXPECT_TRUE(std::filesystem::exists(p.cache_file));
  EXPECT_FALSE(g.measure(150e9).valid);
  EXPECT_TRUE(g.refused());
  EXPECT_FALSE(std::filesystem::exists(p.cache_file));
  std::ofstream(p.cache_file) << "key\n1e11\n";  // measured again meanwhile: kept
  EXPECT_FALSE(g.measure(150e9).valid);
  EXPECT_TRUE(std::filesystem::exists(p.cache_file));
  EXPECT_EQ(g.peak().flops_per_s, 100e9);

  MfuGauge none;
  EXPECT_FALSE(none.measure(1e9).valid);
  EXPECT_FALSE(none.refused());
}

}  // namespace
}  // namespace keel
