// keel-bench's command line (CLI11, runtime/cli.h): generated help for it and each subcommand,
// usage errors that exit 2 naming the flag (a number's range in words), bad input refused before
// any run, and `keel-bench project` end to end.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "integration/worker_harness.h"
#include "test_paths.h"

namespace keel::test {
namespace {

// Runs keel-bench with `args` in a folder of its own; its stdout and stderr apart.
Ran keel_bench(const std::string& args) {
  return run_in(temp_dir("keel_bench_cli"), bin_dir() + "/keel-bench " + args);
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

// Bad input of every kind, refused before any run starts (each case takes milliseconds): the
// exit status, a fragment of the one "keel-bench: error:" line, and no --out directory made.
TEST(KeelBenchCli, BadInputIsRefusedAtOnceSayingTheRange) {
  const std::string dir = temp_dir("keel_bench_bad_input");
  const std::string cfg = std::string(KEEL_SOURCE_DIR) + "/examples/configs/tiny-gpt-3d.pbtxt";
  const std::string out = dir + "/out";
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const std::string typo = write("typo.pbtxt",
                                 "fault { kind: crash step: 3 rank: 0 }\n"
                                 "fault { kind: crsh step: 5 rank: 1 }\n");
  const std::string far_rank = write("rank.pbtxt", "fault { kind: crash step: 3 rank: 99 }\n");
  const std::string report = write("report.json", "{ not json");
  const std::string job = "--config " + cfg + " --out " + out + " ";
  const std::string project = "project --mtbf-hours 10000 --step-s 2 --state-gb 20 ";
  struct Case {
    std::string args;
    int rc;
    std::string said;
  };
  const Case cases[] = {
      // keel-bench's own flags.
      {job + "--mtbf-s nan", 2, "--mtbf-s nan: must be a number > 0 (seconds)"},
      {job + "--mtbf-s inf", 2, "--mtbf-s inf: must be a number > 0 (seconds)"},
      {job + "--mtbf-s 1e400", 2, "--mtbf-s 1e400: must be a number > 0"},
      {job + "--mtbf-s -5", 2, "--mtbf-s -5: must be a number > 0"},
      {job + "--seed -1", 2, "--seed -1: must be a whole number from 0 to"},
      {job + "--seed 1.5", 2, "--seed 1.5: must be a whole number"},
      {job + "--persistent-every 0", 2, "--persistent-every 0: must be a whole number from 1 to"},
      {job + "--persistent-every 99999999999", 2, "--persistent-every 99999999999: must be"},
      {job + "--local 0", 2, "--local 0: must be a whole number from 1 to 4096"},
      {job + "--local 2.5", 2, "--local 2.5: must be a whole number from 1 to 4096"},
      {job + "--standby -1", 2, "--standby -1: must be a whole number from 0 to 4096"},
      {job + "--workers-per-slot 5000", 2, "--workers-per-slot 5000: must be a whole number"},
      {job + "--workers-per-slot 3", 2, "--workers-per-slot 3: the job's world of 8 ranks"},
      {"--soak 0 " + job, 2, "--soak 0: must be a whole number from 1 to 100000"},
      {"--soak nan " + job, 2, "--soak nan: must be a whole number"},
      {"--soak 1 " + job + "--soak-kill-controller-every nan", 2,
       "--soak-kill-controller-every nan: must be a number from 0 to 3600 (seconds)"},
      {"--soak 1 " + job + "--soak-kill-controller-every -inf", 2,
       "--soak-kill-controller-every -inf: must be a number from 0 to 3600"},
      // --inject and --fault: their syntax and ranks, told before the fault-free run.
      {job + "--inject " + typo, 2, "typo.pbtxt:2:"},
      {job + "--inject " + far_rank, 2, "rank.pbtxt:1: fault[0].rank = 99: must be < the world"},
      {job + "--inject " + dir + "/none.pbtxt", 2, "none.pbtxt: cannot open"},
      {job + "--fault crash@step=3", 2, "--fault 'crash@step=3': missing rank=R"},
      {job + "--fault crush@step=3,rank=0", 2, "unknown kind 'crush'"},
      {"--config " + dir + "/none.pbtxt --out " + out, 2, "none.pbtxt: cannot open"},
      // The subcommands.
      {"cpu --steps 1.5", 2, "--steps 1.5: must be a whole number from 1 to 1000000"},
      {"cpu --threads 0", 2, "--threads 0: must be a whole number from 1 to 4096"},
      {"recovery --every 0", 2, "--every 0: must be a whole number from 1 to 1000000"},
      {"recovery --tiny-steps -1", 2, "--tiny-steps -1: must be a whole number from 0 to"},
      {"detect --injections 99999999999999999999", 2, "--injections 99999999999999999999: must"},
      {"detect --pairs nan", 2, "--pairs nan: must be a whole number from 0 to 1000"},
      {"sdc --every 10,x", 2, "--every x: must be a whole number from 1 to 1000000"},
      {"sdc --rounds 0", 2, "--rounds 0: must be a whole number from 1 to 1000"},
      {"restore --repeats inf", 2, "--repeats inf: must be a whole number from 1 to 1000"},
      {"control-plane --steady-s nan", 2,
       "--steady-s nan: must be a number from 0.5 to 600 (seconds)"},
      {"control-plane --steady-s inf", 2, "--steady-s inf: must be a number from 0.5 to 600"},
      {project + "--machines 0", 2, "--machines 0: must be a whole number from 1 to 1000000"},
      {project + "--machines 3000000000", 2, "--machines 3000000000: must be a whole number"},
      {project + "--gpus-per-machine 100000", 2, "--gpus-per-machine 100000: must be a whole"},
      {"project --mtbf-hours nan --step-s 2 --state-gb 20", 2,
       "--mtbf-hours nan: must be a number from 0.001 to 10000000 (hours)"},
      {"project --mtbf-hours 10000 --step-s 0 --state-gb 20", 2,
       "--step-s 0: must be a number from 0.001 to 86400 (seconds)"},
      {"project --mtbf-hours 10000 --step-s 2 --state-gb inf", 2,
       "--state-gb inf: must be a number from 0 to 100000 (GB)"},
      {"project --mtbf-hours 10000 --step-s 2 --state-gb -1", 2, "--state-gb -1: must be"},
      {project + "--link-gbps 0", 2, "--link-gbps 0: must be a number from 0.001 to 100000"},
      {project + "--standbys -1", 2, "--standbys -1: must be a whole number from 0 to 1000000"},
      {project + "--repair-hours nan", 2, "--repair-hours nan: must be a number from 0.001"},
      {project + "--checkpoint-every-steps 0", 2, "--checkpoint-every-steps 0: must be a whole"},
      {project + "--from " + report, 2, "--from " + report + ": not a RunReport JSON"},
  };
  for (const Case& c : cases) {
    const Ran r = keel_bench(c.args);
    EXPECT_EQ(r.rc, c.rc) << c.args << "\n" << r.out << r.err;
    EXPECT_TRUE(contains(r.err, c.said)) << c.args << "\n" << r.err;
    // One line says what is wrong (the --help hint may follow), and nothing ran.
    EXPECT_EQ(r.err.rfind("keel-bench: error: ", 0), 0u) << c.args << "\n" << r.err;
    EXPECT_LT(r.err.find('\n'), 300u) << "a range a person cannot read:\n" << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.args << ": made " << out;
  }
}

// Values at the ends of the ranges, and written as people write them, still go.
TEST(KeelBenchCli, ProjectTakesTheEndsOfItsRanges) {
  const Ran r = keel_bench(
      "project --machines 1e6 --gpus-per-machine 1024 --mtbf-hours 0.001 --step-s 86400 "
      "--state-gb 100000 --link-gbps 0.001 --standbys 010 --repair-hours 100000");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "1000000 machines x 1024 GPUs = 1024000000 GPUs")) << r.out;
  EXPECT_FALSE(contains(r.out, "nan")) << r.out;
  EXPECT_FALSE(contains(r.out, "inf")) << r.out;
  // 010 is ten standbys, not octal 8.
  EXPECT_TRUE(contains(r.out, "K = 10")) << r.out;
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
