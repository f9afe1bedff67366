// keel-worker finds its GEMM path itself: with nothing set it runs (and reports) the best
// OpenBLAS core for this CPU, a core named in the config makes it re-execute onto that core
// (OpenBLAS reads OPENBLAS_CORETYPE only at load, so the report's core proves the re-exec),
// and a user's OPENBLAS_CORETYPE is respected with a note.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>

#include "runtime/cpu/blas_core.h"
#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

// Sets (or unsets, with nullopt) an environment variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const char* kArgs = " --set train.steps=2 --set train.eval_every=0";

struct Env {
  ScopedEnv core{"OPENBLAS_CORETYPE", std::nullopt};
  ScopedEnv marker{"KEEL_BLAS_CORE", std::nullopt};
  ScopedEnv cache;
  explicit Env(const std::string& dir) : cache("KEEL_CACHE_DIR", dir + "/cache") {}
};

TEST(BlasCore, WithNothingSetRunsTheBestCore) {
  const std::string dir = temp_dir("blas_best");
  Env env(dir);
  WorkerRun r = run_worker(dir, "--config " + write_config(dir) + kArgs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string core = json_string_field(r.report, "blas_core");
  const std::string best = json_string_field(r.report, "blas_core_best");
  EXPECT_GE(blas_core_rank(core), blas_core_rank(best)) << core << " vs best " << best;
  EXPECT_NE(json_string_field(r.report, "blas").find("OpenBLAS"), std::string::npos) << r.report;
  EXPECT_FALSE(json_string_field(r.report, "cpu_isa").empty());
  const std::string by = json_string_field(r.report, "blas_core_chosen_by");
  EXPECT_TRUE(by == "OpenBLAS" || by == "keel") << by;
  EXPECT_LE(json_number_field(r.report, "mfu"), 1.0);
}

TEST(BlasCore, ACoreNamedInTheConfigIsRunByReexecuting) {
  const std::string dir = temp_dir("blas_forced");
  Env env(dir);
  // A core below this CPU's best that it can still run.
  const std::string best = best_blas_core(cpu_features());
  const std::string lesser = blas_core_rank(best) >= blas_core_rank("SkylakeX")  ? "Haswell"
                             : blas_core_rank(best) >= blas_core_rank("Haswell") ? "Sandybridge"
                                                                                 : "";
  if (lesser.empty()) GTEST_SKIP() << "no core below this CPU's best (" << best << ")";
  WorkerRun r = run_worker(
      dir, "--config " + write_config(dir) + kArgs + " --set runtime.blas_core=" + lesser);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "blas_core"), lesser) << r.report;
  EXPECT_EQ(json_string_field(r.report, "blas_core_chosen_by"), "runtime.blas_core");
  EXPECT_EQ(json_string_field(r.report, "blas_core_best"), best);
}

TEST(BlasCore, TheUsersVariableIsRespectedWithANote) {
  const std::string dir = temp_dir("blas_user");
  Env env(dir);
  ScopedEnv user("OPENBLAS_CORETYPE", "Prescott");
  WorkerRun r = run_worker(dir, "--config " + write_config(dir) + kArgs);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "blas_core"), "Prescott") << r.report;
  EXPECT_EQ(json_string_field(r.report, "blas_core_chosen_by"), "OPENBLAS_CORETYPE");
  const std::string best = best_blas_core(cpu_features());
  if (blas_core_rank(best) > blas_core_rank("Prescott")) {
    EXPECT_NE(r.output.find("keel would choose " + best), std::string::npos) << r.output;
  }
}

TEST(BlasCore, AnUnknownCoreInTheConfigIsAnInputError) {
  const std::string dir = temp_dir("blas_bad");
  const std::string cfg = write_config(dir);
  WorkerRun r = run_worker(dir, "--config " + cfg + " --set runtime.blas_core=Pentium9000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("runtime.blas_core = \"Pentium9000\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(cfg), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::test
