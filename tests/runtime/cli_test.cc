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

// One flag of each number check, parsed as a binary parses it.
struct Numbers {
  std::optional<int> rc;
  std::string err;
  int count = -1;
  int64_t big = -1;
  double seconds = -1, fraction = -1, hours = -1;
  std::string name;
};

Numbers parse_numbers(std::vector<std::string> args) {
  Numbers n;
  CLI::App app("a test binary", "keel-test");
  app.add_option("--count", n.count)->transform(whole_number(1, 4096));
  app.add_option("--big", n.big)->transform(whole_number(0, INT64_MAX));
  app.add_option("--seconds", n.seconds)->transform(number_above(0, "seconds"));
  app.add_option("--fraction", n.fraction)->transform(number_under(0, 1));
  app.add_option("--hours", n.hours)->transform(number(0.001, 1e7, "hours"));
  app.add_option("--name", n.name)
      ->check(must_be([](const std::string& s) { return s.find('/') == std::string::npos; },
                      "a name without '/'"));
  Argv a(std::move(args));
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  n.rc = parse(app, a.argc(), a.argv());
  testing::internal::GetCapturedStdout();
  n.err = testing::internal::GetCapturedStderr();
  return n;
}

TEST(Cli, NumberChecksSayTheRangeInWordsNamingFlagAndValue) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--count", "0"}, "--count 0: must be a whole number from 1 to 4096"},
      {{"--count", "4097"}, "--count 4097: must be a whole number from 1 to 4096"},
      {{"--count", "1.5"}, "--count 1.5: must be a whole number from 1 to 4096"},
      {{"--count", "nan"}, "--count nan: must be a whole number"},
      {{"--count", "x"}, "--count x: must be a whole number"},
      {{"--count", "3000000000"}, "--count 3000000000: must be a whole number"},
      {{"--big", "99999999999999999999"},
       "--big 99999999999999999999: must be a whole number "
       "from 0 to 9223372036854775807"},
      {{"--big", "-1"}, "--big -1: must be a whole number from 0 to"},
      {{"--big", "1e300"}, "--big 1e300: must be a whole number"},
      {{"--seconds", "nan"}, "--seconds nan: must be a number > 0 (seconds)"},
      {{"--seconds", "inf"}, "--seconds inf: must be a number > 0 (seconds)"},
      {{"--seconds", "-inf"}, "--seconds -inf: must be a number > 0 (seconds)"},
      {{"--seconds", "1e400"}, "--seconds 1e400: must be a number > 0 (seconds)"},
      {{"--seconds", "0"}, "--seconds 0: must be a number > 0 (seconds)"},
      {{"--seconds", "5s"}, "--seconds 5s: must be a number > 0 (seconds)"},
      {{"--fraction", "1"}, "--fraction 1: must be a number >= 0 and < 1"},
      {{"--fraction", "-0.1"}, "--fraction -0.1: must be a number >= 0 and < 1"},
      {{"--hours", "0"}, "--hours 0: must be a number from 0.001 to 10000000 (hours)"},
      {{"--hours", "2e7"}, "--hours 2e7: must be a number from 0.001 to 10000000 (hours)"},
      {{"--name", "a/b"}, "--name a/b: must be a name without '/'"},
  };
  for (const auto& [args, said] : cases) {
    const Numbers n = parse_numbers(args);
    ASSERT_TRUE(n.rc.has_value()) << args[0] << " " << (args.size() > 1 ? args[1] : "");
    EXPECT_EQ(*n.rc, 2) << args[0];
    EXPECT_EQ(n.err.rfind("keel-test: error: " + said, 0), 0u) << n.err;
    EXPECT_TRUE(has(n.err, "\nrun with --help for usage\n")) << n.err;
  }
}

TEST(Cli, NumberChecksTakeWhatAPersonWritesAndConvertWhatTheyChecked) {
  const Numbers n = parse_numbers({"--count", "010", "--big", "1e6", "--seconds", "0.5",
                                   "--fraction", "0", "--hours", "1e7", "--name", "ok_"});
  ASSERT_FALSE(n.rc.has_value()) << n.err;
  EXPECT_EQ(n.count, 10);  // decimal, not CLI11's octal 8
  EXPECT_EQ(n.big, 1'000'000);
  EXPECT_EQ(n.seconds, 0.5);
  EXPECT_EQ(n.fraction, 0);
  EXPECT_EQ(n.hours, 1e7);
  EXPECT_EQ(n.name, "ok_");
  EXPECT_EQ(parse_numbers({"--count", "+4096"}).count, 4096);
  EXPECT_EQ(parse_numbers({"--big", "9223372036854775807"}).big, INT64_MAX);
  EXPECT_EQ(parse_numbers({"--seconds", "1e-3"}).seconds, 0.001);
}

// A floating-point flag declared with no check of runtime/cli.h, or with CLI11's own Range
// (which passes NaN), refuses what is not a finite number all the same (issue 43, item 9), and
// still takes a finite one; a flag with a check of its own keeps that check's words.
TEST(Cli, EveryFloatingPointFlagRefusesNanAndInfinity) {
  const auto run = [](const std::vector<std::string>& args) {
    CLI::App app("a test binary", "keel-test");
    CLI::App* sub = app.add_subcommand("sub", "a subcommand");
    double plain = 1, ranged = 1, own = 1;
    std::vector<double> list;
    app.add_option("--plain", plain, "no check")->option_text("X");
    sub->add_option("--ranged", ranged, "CLI11's range")->check(CLI::Range(0.5, 600.0));
    app.add_option("--list", list, "several")->delimiter(',');
    app.add_option("--own", own, "keel's check")->transform(number_above(0, "seconds"));
    Argv a(args);
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    Numbers n;
    n.rc = parse(app, a.argc(), a.argv());
    testing::internal::GetCapturedStdout();
    n.err = testing::internal::GetCapturedStderr();
    n.seconds = plain + ranged + own;
    for (double v : list) n.seconds += v;
    return n;
  };
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--plain", "nan"}, "--plain nan: must be a finite number"},
      {{"--plain", "-inf"}, "--plain -inf: must be a finite number"},
      {{"--plain", "1e400"}, "--plain 1e400: must be a finite number"},
      {{"sub", "--ranged", "nan"}, "--ranged nan: must be a finite number"},
      {{"sub", "--ranged", "inf"}, "--ranged inf: must be a finite number"},
      {{"--list", "1,nan"}, "--list nan: must be a finite number"},
      {{"--own", "nan"}, "--own nan: must be a number > 0 (seconds)"},
  };
  for (const auto& [args, said] : cases) {
    const Numbers n = run(args);
    ASSERT_TRUE(n.rc.has_value()) << args.back();
    EXPECT_EQ(*n.rc, 2) << args.back();
    EXPECT_EQ(n.err.rfind("keel-test: error: " + said, 0), 0u) << n.err;
  }
  const Numbers ok = run({"--plain", "2.5", "--list", "1,2", "--own", "1", "sub", "--ranged", "3"});
  EXPECT_FALSE(ok.rc.has_value()) << ok.err;
  EXPECT_EQ(ok.seconds, 2.5 + 3 + 1 + 1 + 2);
  EXPECT_TRUE(run({"sub", "--ranged", "0.1"}).rc.has_value());  // CLI11's range still holds
}

}  // namespace
}  // namespace keel::cli
