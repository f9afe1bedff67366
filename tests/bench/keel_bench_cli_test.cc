// keel-bench's command line (CLI11, runtime/cli.h): generated help for it and each subcommand,
// usage errors that exit 2 naming the flag, and `keel-bench project` end to end.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "integration/worker_harness.h"
#include "test_paths.h"

namespace keel::test {
namespace {

struct Ran {
  int rc = -1;
  std::string out, err;
};

// Runs keel-bench with `args`; its stdout and stderr apart.
Ran keel_bench(const std::string& args) {
  const std::string dir = temp_dir("keel_bench_cli");
  const std::string cmd = "timeout 60 " + bin_dir() + "/keel-bench " + args + " > " + dir +
                          "/out.txt 2> " + dir + "/err.txt";
  const int st = std::system(cmd.c_str());
  Ran r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  r.out = read_text(dir + "/out.txt");
  r.err = read_text(dir + "/err.txt");
  return r;
}

TEST(KeelBenchCli, HelpNamesEverySubcommandAndItsFlags) {
  const Ran top = keel_bench("--help");
  ASSERT_EQ(top.rc, 0) << top.err;
  for (const char* s : {"--config", "--inject", "--mtbf-s", "--policies", "--standby", "--soak",
                        "cpu", "recovery", "detect", "sdc", "restore", "project"})
    EXPECT_TRUE(contains(top.out, s)) << s << "\n" << top.out;
  const std::pair<const char*, const char*> subs[] = {
      {"cpu", "--layouts"},      {"recovery", "--tiny-steps"}, {"detect", "--injections"},
      {"sdc", "--no-breakdown"}, {"restore", "--no-netns"},    {"project", "--mtbf-hours"}};
  for (const auto& [sub, flag] : subs) {
    const Ran r = keel_bench(std::string(sub) + " --help");
    EXPECT_EQ(r.rc, 0) << sub << ": " << r.err;
    EXPECT_TRUE(contains(r.out, std::string("keel-bench ") + sub)) << r.out;
    EXPECT_TRUE(contains(r.out, flag)) << sub << "\n" << r.out;
    EXPECT_FALSE(contains(r.out, "--sgemm-child")) << "a helper's flag shows in " << sub;
  }
}

TEST(KeelBenchCli, UsageErrorsExitTwoNamingTheFlag) {
  const std::string cfg = std::string(KEEL_SOURCE_DIR) + "/examples/configs/tiny-gpt-3d.pbtxt";
  const std::pair<std::string, std::string> cases[] = {
      {"--out /tmp/x", "--config and --out are required"},
      {"--config " + cfg + " --out /tmp/x --kinds crash,bogus", "--kinds"},
      {"--config " + cfg + " --out /tmp/x --policies hot_swap,fastest", "--policies"},
      {"--config " + cfg + " --out /tmp/x --mtbf-s 5 --fault crash@step=3,rank=0", "--mtbf-s"},
      {"--config " + cfg + " --out /tmp/x --persistent-every 0", "--persistent-every"},
      {"--config " + cfg + " cpu", "--config is keel-bench's own flag"},
      {"cpu --sizes huge", "--sizes"},
      {"detect --kinds crash,teleport", "--kinds"},
      {"project --mtbf-hours 1 --state-gb 1", "--step-s"},
      {"project --mtbf-hours 1 --step-s 1 --state-gb 1 --machines 0", "--machines"},
      {"teleport", "teleport"},
  };
  for (const auto& [args, said] : cases) {
    const Ran r = keel_bench(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "keel-bench: error:")) << args << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, said)) << args << "\n" << r.err;
  }
}

TEST(KeelBenchCli, ProjectPrintsTheAskedPoliciesAtScale) {
  const Ran r = keel_bench(
      "project --machines 1250 --gpus-per-machine 8 --mtbf-hours 10000 --step-s 2 --state-gb 20 "
      "--policies hot_swap,restart_all");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "10000 GPUs")) << r.out;
  // A table row per policy asked for, and none for the other.
  EXPECT_TRUE(contains(r.out, "\nhot_swap ")) << r.out;
  EXPECT_TRUE(contains(r.out, "\nrestart_all ")) << r.out;
  EXPECT_FALSE(contains(r.out, "\nin_place ")) << r.out;
  EXPECT_TRUE(contains(r.out, "97%")) << r.out;
}

}  // namespace
}  // namespace keel::test
