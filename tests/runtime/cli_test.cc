// runtime/cli.h: the shared flag groups and parse()'s exit statuses and messages, through a
// real CLI::App as a binary builds it.
#include "runtime/cli.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace keel::cli {
namespace {

// argv for parse(): argv[0] then `args`, kept alive with the strings.
struct Argv {
  explicit Argv(std::vector<std::string> args) : text(std::move(args)) {
    text.insert(text.begin(), "keel-test");
    for (auto& s : text) ptrs.push_back(s.data());
  }
  int argc() const { return int(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> text;
  std::vector<char*> ptrs;
};

struct Parsed {
  std::optional<int> rc;
  std::string out, err;
  JobFlags job;
  SlotFlags slots;
  FaultFlags faults;
};

Parsed parse_args(std::vector<std::string> args, bool config_required = false) {
  Parsed p;
  CLI::App app("a test binary", "keel-test");
  add_job_flags(app, &p.job, config_required);
  add_slot_flags(app, &p.slots);
  add_fault_flags(app, &p.faults);
  Argv a(std::move(args));
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  p.rc = parse(app, a.argc(), a.argv());
  p.out = testing::internal::GetCapturedStdout();
  p.err = testing::internal::GetCapturedStderr();
  return p;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Cli, HelpPrintsEveryFlagAndEndsWithZero) {
  const Parsed p = parse_args({"--help"}, /*config_required=*/true);
  ASSERT_TRUE(p.rc.has_value());
  EXPECT_EQ(*p.rc, 0);
  for (const char* flag :
       {"--config", "--set", "--local", "--standby", "--workers-per-slot", "--fault", "--inject"})
    EXPECT_TRUE(has(p.out, flag)) << flag << " not in\n" << p.out;
  EXPECT_TRUE(p.err.empty()) << p.err;
}

TEST(Cli, GoodFlagsGoOnWithTheirValues) {
  const Parsed p = parse_args({"--config", "c.pbtxt", "--local", "4", "--standby=1",
                               "--workers-per-slot", "2", "--inject", "f.pbtxt"});
  EXPECT_FALSE(p.rc.has_value()) << p.err;
  EXPECT_EQ(p.job.config, "c.pbtxt");
  EXPECT_EQ(p.slots.local, 4);
  EXPECT_EQ(p.slots.standby, 1);
  EXPECT_EQ(p.slots.workers_per_slot, 2);
  EXPECT_EQ(p.faults.inject, "f.pbtxt");
}

TEST(Cli, OutOfRangeCountNamesTheFlagAndValue) {
  for (const char* bad : {"0", "4097", "x", "-3"}) {
    const Parsed p = parse_args({"--local", bad});
    ASSERT_TRUE(p.rc.has_value()) << bad;
    EXPECT_EQ(*p.rc, 2) << bad;
    EXPECT_TRUE(has(p.err, std::string("keel-test: error: --local: Value ") + bad)) << p.err;
    EXPECT_TRUE(has(p.err, "run with --help for usage")) << p.err;
    EXPECT_TRUE(p.out.empty()) << p.out;
  }
}

TEST(Cli, MissingValueNamesTheFlag) {
  const Parsed p = parse_args({"--local"});
  ASSERT_TRUE(p.rc.has_value());
  EXPECT_EQ(*p.rc, 2);
  EXPECT_TRUE(has(p.err, "keel-test: error: --local: 1 required N missing")) << p.err;
}

TEST(Cli, UnknownFlagIsNamed) {
  const Parsed p = parse_args({"--config", "c", "--bogus"});
  ASSERT_TRUE(p.rc.has_value());
  EXPECT_EQ(*p.rc, 2);
  EXPECT_TRUE(has(p.err, "keel-test: error: The following argument was not expected: --bogus"))
      << p.err;
}

TEST(Cli, RequiredConfigIsSaidWhenMissing) {
  const Parsed p = parse_args({"--local", "2"}, /*config_required=*/true);
  ASSERT_TRUE(p.rc.has_value());
  EXPECT_EQ(*p.rc, 2);
  EXPECT_TRUE(has(p.err, "keel-test: error: --config is required")) << p.err;
  // Not required: absent is fine (keel-launch --resume finds it in the run directory).
  EXPECT_FALSE(parse_args({"--local", "2"}).rc.has_value());
}

TEST(Cli, RepeatableFlagsKeepTheirOrderAndTakeOneValueEach) {
  const Parsed p = parse_args({"--set", "train.steps=20", "--fault", "crash@step=3,rank=1", "--set",
                               "model.n_layer=-2", "--fault", "hang@step=5,rank=0", "--set=a.b=c"});
  EXPECT_FALSE(p.rc.has_value()) << p.err;
  EXPECT_EQ(p.job.set, (std::vector<std::string>{"train.steps=20", "model.n_layer=-2", "a.b=c"}));
  EXPECT_EQ(p.faults.fault,
            (std::vector<std::string>{"crash@step=3,rank=1", "hang@step=5,rank=0"}));
  // One value per --set: a second word is not an override but an unexpected argument.
  const Parsed two = parse_args({"--set", "a=1", "b=2"});
  ASSERT_TRUE(two.rc.has_value());
  EXPECT_EQ(*two.rc, 2);
  EXPECT_TRUE(has(two.err, "b=2")) << two.err;
}

TEST(Cli, AFlagGivenTwiceKeepsTheLastValue) {
  const Parsed p = parse_args({"--config", "a.pbtxt", "--local", "2", "--config", "b.pbtxt"});
  EXPECT_FALSE(p.rc.has_value()) << p.err;
  EXPECT_EQ(p.job.config, "b.pbtxt");
}

TEST(Cli, UsageErrorSaysTheProgramAndEndsWithTwo) {
  CLI::App app("a test binary", "keel-test");
  testing::internal::CaptureStderr();
  EXPECT_EQ(usage_error(app, "--join needs --slot K and --job ID"), 2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "keel-test: error: --join needs --slot K and --job ID\nrun with --help for usage\n");
}

}  // namespace
}  // namespace keel::cli
