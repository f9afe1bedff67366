// The golden mini-GPT self-check: the run is bitwise reproducible, this machine's digest is the
// repo's, and a defective unit (one flipped bit of one gradient value, through the Trainer's
// fault hook) or a wrong reference fails it with a message that names both digests.
#include "robust/golden_check.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runtime/cpu/blas_core.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

class GoldenCheckTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = make_cpu_backend(1);
  std::shared_ptr<Plugin> plugin_ = Plugin::load(test::bin_dir() + "/libkeel_gpt.so");
};

TEST_F(GoldenCheckTest, KeyNamesBackendPrecisionAndBlasCore) {
  EXPECT_EQ(golden_key(*backend_), "cpu fp32 " + blas_path().core);
  // A CPU computes in fp32 whatever precision the caller names.
  EXPECT_EQ(golden_key(*backend_, Precision::kBf16), "cpu fp32 " + blas_path().core);
}

TEST_F(GoldenCheckTest, RunIsBitwiseReproducible) {
  const GoldenCheckResult a = golden_check(*backend_, plugin_);
  const GoldenCheckResult b = golden_check(*backend_, plugin_);
  ASSERT_NE(a.digest, 0u) << a.message;
  EXPECT_EQ(a.digest, b.digest) << a.message << "\n" << b.message;
  // Another backend object with the same thread count computes the same bits.
  auto other = make_cpu_backend(1);
  EXPECT_EQ(golden_check(*other, plugin_).digest, a.digest);
}

TEST_F(GoldenCheckTest, MatchesTheRepoDigestOnThisMachine) {
  const GoldenCheckResult r = golden_check(*backend_, plugin_);
  if (!golden_reference(r.key))
    GTEST_SKIP() << "robust/golden_digests.h has no digest for '" << r.key
                 << "' (run scripts/regen-golden-digests.sh on such a machine): " << r.message;
  EXPECT_TRUE(r.compared);
  EXPECT_TRUE(r.ok) << r.message
                    << "\n(if the model's numerics changed on purpose, run "
                       "scripts/regen-golden-digests.sh)";
  EXPECT_NE(r.message.find("matches the repo's for " + r.key), std::string::npos) << r.message;
  EXPECT_NE(r.message.find(hex(r.digest)), std::string::npos) << r.message;
}

TEST_F(GoldenCheckTest, OneFlippedGradientBitInTheSecondStepFails) {
  const GoldenCheckResult clean = golden_check(*backend_, plugin_);
  ASSERT_NE(clean.digest, 0u) << clean.message;
  int flips = 0;
  TrainerHooks hooks;
  hooks.computed = [&](int64_t step, TensorClass cls, float* data, size_t n, bool recompute) {
    if (step != 1 || cls != TensorClass::kGrad || recompute) return;
    // The top mantissa bit of the first non-zero gradient value: wrong by up to half its
    // value, yet finite (a defective unit, not a NaN the step would refuse).
    for (size_t i = 0; i < n; ++i)
      if (data[i] != 0.0f) {
        uint32_t bits;
        std::memcpy(&bits, &data[i], sizeof bits);
        bits ^= 1u << 22;
        std::memcpy(&data[i], &bits, sizeof bits);
        ++flips;
        return;
      }
  };
  const GoldenCheckResult bad = golden_check(*backend_, plugin_, hooks, clean.digest);
  ASSERT_EQ(flips, 1) << "the Trainer did not hand the golden run's gradient to the hook";
  EXPECT_FALSE(bad.ok);
  EXPECT_TRUE(bad.compared);
  EXPECT_NE(bad.digest, 0u) << bad.message;
  EXPECT_NE(bad.digest, clean.digest);
  EXPECT_NE(bad.message.find(hex(bad.digest) + " differs from the reference " + hex(clean.digest)),
            std::string::npos)
      << bad.message;
  EXPECT_NE(bad.message.find("this device computes wrong"), std::string::npos) << bad.message;
  // The same fault against the repo's digest, where this machine has one.
  if (golden_reference(clean.key)) {
    flips = 0;
    const GoldenCheckResult repo = golden_check(*backend_, plugin_, hooks);
    EXPECT_EQ(flips, 1);
    EXPECT_FALSE(repo.ok);
    EXPECT_NE(repo.message.find("differs from the repo's"), std::string::npos) << repo.message;
  }
}

TEST_F(GoldenCheckTest, WrongReferenceFails) {
  const GoldenCheckResult clean = golden_check(*backend_, plugin_);
  const uint64_t wrong = clean.digest ^ 1;
  const GoldenCheckResult r = golden_check(*backend_, plugin_, {}, wrong);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.compared);
  EXPECT_EQ(r.digest, clean.digest);
  EXPECT_NE(r.message.find("differs from the reference " + hex(wrong)), std::string::npos)
      << r.message;
  // And the right one passes.
  const GoldenCheckResult right = golden_check(*backend_, plugin_, {}, clean.digest);
  EXPECT_TRUE(right.ok) << right.message;
  EXPECT_NE(right.message.find("matches the reference"), std::string::npos) << right.message;
}

TEST_F(GoldenCheckTest, ARunThatThrowsIsAFailedCheckNotAnException) {
  TrainerHooks hooks;
  hooks.computed = [](int64_t step, TensorClass cls, float* data, size_t, bool) {
    if (step == 0 && cls == TensorClass::kGrad) data[0] = NAN;  // the step refuses it
  };
  GoldenCheckResult r;
  ASSERT_NO_THROW(r = golden_check(*backend_, plugin_, hooks));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("did not complete"), std::string::npos) << r.message;
}

// The runtime's check (standbys, diagnostics, the SDC tie-break) trains keel's GPT as shipped
// beside the executable, whatever the job's plugin: a Llama job's standby gets the GPT's digest,
// and so does a machine whose working directory holds another libkeel_gpt.so.
TEST_F(GoldenCheckTest, TheRuntimeCheckTrainsKeelsGptWhateverTheJobTrains) {
  const std::shared_ptr<Plugin> golden = golden_plugin();
  EXPECT_EQ(golden->name(), plugin_->name());
  EXPECT_TRUE(std::filesystem::equivalent(golden->path(), test::bin_dir() + "/libkeel_gpt.so"))
      << golden->path();
  EXPECT_EQ(golden_plugin(), golden) << "loaded once per process";
  const GoldenCheckResult gpt = golden_check(*backend_, plugin_);
  const GoldenCheckResult runtime = golden_check(*backend_);
  EXPECT_EQ(runtime.digest, gpt.digest) << runtime.message;
  EXPECT_EQ(runtime.ok, gpt.ok) << runtime.message;
  // The Llama trains to another digest: that one is no reference for the machine.
  auto llama = Plugin::load(test::bin_dir() + "/libkeel_llama.so");
  EXPECT_NE(golden_check(*backend_, llama, {}, gpt.digest).digest, gpt.digest);
}

// The run's token shard lives in a private folder that is gone when the check returns.
TEST_F(GoldenCheckTest, LeavesNoTemporaryFiles) {
  const std::string tmp = test::temp_dir("golden");
  ASSERT_EQ(setenv("TMPDIR", tmp.c_str(), 1), 0);
  const GoldenCheckResult r = golden_check(*backend_, plugin_);
  unsetenv("TMPDIR");
  EXPECT_NE(r.digest, 0u) << r.message;
  DIR* d = opendir(tmp.c_str());
  ASSERT_NE(d, nullptr);
  int entries = 0;
  while (dirent* e = readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++entries;
  closedir(d);
  EXPECT_EQ(entries, 0);
}

}  // namespace
}  // namespace keel
