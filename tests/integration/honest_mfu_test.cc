// An MFU above 100% is never printed: keel-worker started with a stale cached peak (the
// issue's 241 GFLOP/s cache that made it print 128%) reports no MFU, says which peak is
// stale, and drops the cache so that the next start measures again.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/cpu/blas_core.h"
#include "runtime/cpu/sgemm_peak.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

TEST(HonestMfu, AStaleCachedPeakIsNamedAndDropped) {
  const std::string dir = temp_dir("stale_peak");
  const std::string cache = dir + "/cache";
  std::filesystem::create_directories(cache);
  // This process's key; the worker runs the same core (runtime.blas_core) and one thread.
  const std::string core = blas_path().core;
  const std::string key = sgemm_peak_cache_key(1);
  const std::string file = cache + "/" + sgemm_peak_cache_name(key, 1);
  std::ofstream(file) << key << "\n1e6\n";  // 1 MFLOP/s: any model beats it
  setenv("KEEL_CACHE_DIR", cache.c_str(), 1);
  WorkerRun r = run_worker(dir, "--config " + write_config(dir) +
                                    " --set train.steps=2 --set runtime.threads=1"
                                    " --set runtime.blas_core=" +
                                    core);
  unsetenv("KEEL_CACHE_DIR");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_number_field(r.report, "mfu_peak_flops"), 1e6) << r.report;
  EXPECT_EQ(json_number_field(r.report, "mfu"), 0);
  const std::string why = json_string_field(r.report, "mfu_unavailable");
  EXPECT_NE(why.find("MFU n/a"), std::string::npos) << why;
  EXPECT_NE(why.find("stale"), std::string::npos) << why;
  EXPECT_NE(why.find("(cached)"), std::string::npos) << why;  // names the peak
  EXPECT_NE(r.output.find("its cache is dropped"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(file));
}

}  // namespace
}  // namespace keel::test
