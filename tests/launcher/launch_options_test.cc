// launcher/launch_options.h: keel-launch's command line, parsed by CLI11 (runtime/cli.h):
// the flags it hands to every keel-worker, in the order given, and its cross-flag checks.
#include "launcher/launch_options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace keel {
namespace {

struct Result {
  std::optional<int> rc;
  LaunchOptions o;
  std::string err;
};

Result parse(std::vector<std::string> args) {
  args.insert(args.begin(), "keel-launch");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  Result r;
  testing::internal::CaptureStderr();
  r.rc = parse_launch_options(int(argv.size()), argv.data(), &r.o);
  r.err = testing::internal::GetCapturedStderr();
  return r;
}

TEST(LaunchOptions, WorkerFlagsPassThroughInTheOrderGiven) {
  const Result r =
      parse({"--fault", "crash@step=3,rank=1", "--config", "c.pbtxt", "--report", "r.json",
             "--local", "2", "--inject", "f.pbtxt", "--fault", "hang@step=5,rank=0",
             "--export-llmc", "w.bin", "--loss-svg", "l.svg", "--set", "train.steps=9", "--quiet"});
  ASSERT_FALSE(r.rc.has_value()) << r.err;
  EXPECT_EQ(r.o.worker_args,
            (std::vector<std::string>{"--fault", "crash@step=3,rank=1", "--report", "r.json",
                                      "--inject", "f.pbtxt", "--fault", "hang@step=5,rank=0",
                                      "--export-llmc", "w.bin", "--loss-svg", "l.svg"}));
  EXPECT_EQ(r.o.config_path, "c.pbtxt");
  EXPECT_EQ(r.o.overrides, std::vector<std::string>{"train.steps=9"});
  EXPECT_EQ(r.o.local, 2);
  EXPECT_TRUE(r.o.quiet);
  EXPECT_EQ(r.o.run_dir, "runs");
}

// keel-worker keeps the last of a repeated --report; keel-launch hands on both, in order.
TEST(LaunchOptions, ARepeatedWorkerFlagPassesThroughEachTime) {
  const Result r = parse({"--config", "c", "--local", "1", "--report", "a.json", "--fault",
                          "crash@step=1,rank=0", "--report", "b.json"});
  ASSERT_FALSE(r.rc.has_value()) << r.err;
  EXPECT_EQ(r.o.worker_args,
            (std::vector<std::string>{"--report", "a.json", "--fault", "crash@step=1,rank=0",
                                      "--report", "b.json"}));
}

TEST(LaunchOptions, CrossFlagChecksNameTheFlags) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--local", "2"}, "--config FILE is required (or --resume runs/<job>)"},
      {{"--config", "c", "--slots", "2", "--local", "2"},
       "--slots N cannot be combined with --local or --join"},
      {{"--config", "c", "--join", "tcp://h:1", "--slot", "1"},
       "--join needs --slot K and --job ID"},
  };
  for (const auto& [args, want] : cases) {
    const Result r = parse(args);
    ASSERT_TRUE(r.rc.has_value()) << want;
    EXPECT_EQ(*r.rc, 2) << want;
    EXPECT_NE(r.err.find("keel-launch: error: " + want), std::string::npos) << r.err;
  }
  // --resume stands in for --config; a join with all it needs goes on.
  EXPECT_FALSE(parse({"--resume", "runs/j", "--local", "2"}).rc.has_value());
  const Result j = parse({"--config", "c", "--join", "tcp://h:1", "--slot", "1", "--job", "j"});
  ASSERT_FALSE(j.rc.has_value()) << j.err;
  EXPECT_EQ(j.o.slot, 1);
  EXPECT_EQ(j.o.job, "j");
}

}  // namespace
}  // namespace keel
