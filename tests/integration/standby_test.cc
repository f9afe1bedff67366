// Warm standbys and hot swap (issue: standbys), with real processes: keel-launch slots on
// this machine, one of them lost (its launcher and workers SIGKILLed, its shared memory
// gone) or hung; a standby slot takes its ranks, the surviving workers never restart, and
// the job ends with the parameters of a fault-free run, bit for bit.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "test_paths.h"
#include "worker_harness.h"

namespace keel::test {
namespace {

constexpr int kSteps = 16;

std::string job_args(const std::string& dir, int standby, const std::string& extra,
                     TestModel model = TestModel::kGpt) {
  std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}}, model);
  return "--config " + cfg + " --local " + std::to_string(4 + standby) +
         " --workers-per-slot 2 --standby " + std::to_string(standby) +
         " --set train.steps=" + std::to_string(kSteps) +
         " --set detect.slot_timeout_ms=1000 --set parallel.comm_timeout_ms=60000 " + extra;
}

JobRun run_fault_free(TestModel model) {
  std::string dir = temp_dir("standby-base-" + test_model_name(model));
  std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}}, model);
  return run_job(dir, "--config " + cfg + " --nproc 8 --set train.steps=" + std::to_string(kSteps));
}

// Run once per model, and only by the tests that need it.
const JobRun& fault_free(TestModel model = TestModel::kGpt) {
  if (model == TestModel::kLlama) {
    static const JobRun llama = run_fault_free(TestModel::kLlama);
    return llama;
  }
  static const JobRun gpt = run_fault_free(TestModel::kGpt);
  return gpt;
}

// One incident of a swap: the step its fault was injected at (as its rank began it), the ranks
// it moved to a standby, and whether the fault took the whole slot at once (slot_loss) or only
// the culprit's process (hang).
struct Swap {
  int step;
  std::set<int> moved;
  bool whole_slot = true;
};

// Finished bitwise equal to the fault-free run, one incident per swap, in order; each swap's
// moved ranks were served by two processes (the lost one and the promoted standby), every other
// rank by one all along; nothing left.
void expect_swapped(const JobRun& r, const std::vector<Swap>& swaps,
                    TestModel model = TestModel::kGpt) {
  const JobRun& base = fault_free(model);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(base.report, "param_checksum"))
      << r.output;
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), swaps.size()) << r.report;
  std::set<int> moved;
  for (size_t n = 0; n < inc.size(); ++n) {
    const std::string& i = inc[n];
    EXPECT_FALSE(json_array_field(i, "standbys_promoted").empty()) << i;
    EXPECT_GE(json_number_field(i, "evicted_at"), json_number_field(i, "detected_at")) << i;
    EXPECT_GE(json_number_field(i, "rebuilt_at"), json_number_field(i, "evicted_at")) << i;
    EXPECT_GE(json_number_field(i, "first_step_at"), json_number_field(i, "rebuilt_at")) << i;
    EXPECT_LE(json_number_field(i, "steps_lost"), 1) << i;
    // Not a restart from step 0: the moved ranks restore on the standby from their backup
    // holders (their own snapshots went with the slot), the others from their own state. Where
    // two incidents come in turn, the ranks the first moved are survivors of the second.
    std::map<int, std::string> sources;
    for (int k : swaps[n].moved) sources[k] = "backup";
    const Swap& w = swaps[n];
    if (w.whole_slot) {
      // The culprit had completed the step before when it began w.step, but the slot's other
      // worker, killed with it, may not have finished that step's last collective: survivors
      // still waiting for its part give that step up. So the job restores w.step or the step
      // before (those of the survivors that did complete it load the step before from their
      // own snapshots), never an older one.
      expect_restored(i, {.min_step = w.step - 1,
                          .max_step = w.step,
                          .from = "memory",
                          .world = 8,
                          .ranks = sources,
                          .others = "memory|own_snapshot"});
    } else {
      // Only the culprit's process stopped, as it began w.step, and its slot-mate completed the
      // step before: no rank could complete w.step, every survivor holds it live.
      expect_restored(
          i, {.step = w.step, .from = "memory", .world = 8, .ranks = sources, .others = "memory"});
    }
    moved.insert(w.moved.begin(), w.moved.end());
  }
  std::vector<std::string> ranks = json_object_array(r.report, "ranks");
  ASSERT_EQ(ranks.size(), 8u);
  for (int k = 0; k < 8; ++k)
    EXPECT_EQ(json_array_field(ranks[size_t(k)], "pids").size(), moved.count(k) ? 2u : 1u)
        << "rank " << k << ": " << ranks[size_t(k)];
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

// For every model: the standby's self-check tests the machine, not the job's plugin (its
// golden run is keel's GPT), so a Llama job's standby is ready and takes over like a GPT's.
class StandbyModels : public testing::TestWithParam<TestModel> {};

TEST_P(StandbyModels, LostSlotIsReplacedByAWarmStandby) {
  std::string dir = temp_dir("standby-loss");
  JobRun r = run_launch_job(dir, job_args(dir, 1, "--fault slot_loss@step=6,rank=5", GetParam()));
  expect_swapped(r, {{6, {4, 5}}}, GetParam());
  EXPECT_TRUE(contains(r.output, "standby slot 4 takes its ranks")) << r.output;
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(json_string_field(inc[0], "kind"), "slot_loss");
  EXPECT_EQ(json_array_field(inc[0], "slots_evicted"), std::vector<double>{2});
}

INSTANTIATE_TEST_SUITE_P(Models, StandbyModels, testing::Values(TestModel::kGpt, TestModel::kLlama),
                         [](const auto& p) { return test_model_name(p.param); });

TEST(Standby, TwoLossesAtDifferentStepsUseTwoStandbys) {
  std::string dir = temp_dir("standby-two");
  JobRun r = run_launch_job(
      dir, job_args(dir, 2, "--fault slot_loss@step=4,rank=3 --fault slot_loss@step=10,rank=6"));
  expect_swapped(r, {{4, {2, 3}}, {10, {6, 7}}});
}

TEST(Standby, HungSlotIsEvictedAndReplaced) {
  std::string dir = temp_dir("standby-hang");
  JobRun r = run_launch_job(dir, job_args(dir, 1, "--fault hang@step=6,rank=5"));
  expect_swapped(r, {{6, {4, 5}, /*whole_slot=*/false}});
  EXPECT_TRUE(contains(r.output, "rejoined as a standby")) << r.output;
}

// Over-eviction: the culprit's whole pipeline group goes (slots 1 and 3 for rank 7), and the
// backups, placed outside the rank's PP group, still hold every rank's state.
TEST(Standby, OverEvictionOfAPipelineGroupLosesNoState) {
  std::string dir = temp_dir("standby-pp");
  JobRun r = run_launch_job(
      dir, job_args(dir, 2, "--set recovery.evict=pp_group --fault slot_loss@step=6,rank=7"));
  expect_swapped(r, {{6, {2, 3, 6, 7}}});
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(json_array_field(inc[0], "slots_evicted").size(), 2u) << inc[0];
}

TEST(Standby, NoStandbyLeftFailsWithAMessage) {
  std::string dir = temp_dir("standby-none");
  JobRun r = run_launch_job(dir, job_args(dir, 0, "--fault slot_loss@step=6,rank=5"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "no standby is ready")) << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty());
}

}  // namespace
}  // namespace keel::test

namespace keel::test {
namespace {

// Under mpirun each MPI rank is a slot; one launcher (MPI rank 2) is killed with its
// workers, --enable-recovery keeps the others alive, and the standby (MPI rank 4) takes over.
TEST(Standby, MpirunWithAStandbySurvivesAKilledLauncher) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  std::string dir = temp_dir("standby-mpi");
  std::string cfg = write_config(dir, {{"parallel", "tp: 2 pp: 2 dp: 2"}});
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  JobRun r = run_command(
      dir, "mpirun -np 5 --oversubscribe --enable-recovery " + bin_dir() +
               "/keel-launch --quiet --report " + dir + "/report.json --run-dir " + dir +
               "/runs --config " + cfg +
               " --workers-per-slot 2 --standby 1 --set train.steps=" + std::to_string(kSteps) +
               " --set detect.slot_timeout_ms=1000 --fault slot_loss@step=6,rank=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(fault_free().report, "param_checksum"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "standby slot 4 takes its ranks")) << r.output;
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  std::vector<std::string> ranks = json_object_array(r.report, "ranks");
  ASSERT_EQ(ranks.size(), 8u);
  for (int k = 0; k < 8; ++k)
    EXPECT_EQ(json_array_field(ranks[size_t(k)], "pids").size(), k == 4 || k == 5 ? 2u : 1u)
        << ranks[size_t(k)];
  std::vector<std::string> mpi_inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(mpi_inc.size(), 1u) << r.report;
  // Rank 5 lost its slot as it began step 6: step 6, or step 5 where its slot-mate died before
  // finishing step 5's last collective (see expect_swapped); ranks 4 and 5 load it from their
  // backups on the standby.
  expect_restored(mpi_inc[0], {.min_step = 5,
                               .max_step = 6,
                               .from = "memory",
                               .world = 8,
                               .ranks = {{4, "backup"}, {5, "backup"}},
                               .others = "memory|own_snapshot"});
  // The job's shared memory is named after its id (line 2 of runs/<job>/controller).
  for (const auto& d : std::filesystem::directory_iterator(dir + "/runs")) {
    std::ifstream in(d.path() / "controller");
    std::string endpoint, job;
    std::getline(in, endpoint);
    std::getline(in, job);
    ASSERT_FALSE(job.empty());
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
      EXPECT_NE(e.path().filename().string().rfind("keel-" + job + "-", 0), 0u)
          << "left behind: " << e.path();
  }
}

}  // namespace
}  // namespace keel::test

namespace keel::test {
namespace {

// No standby and recovery.on_no_standby = wait: a slot lost, the job waits, and the lost
// machine itself comes back (repaired, keel-launch --join): its ranks start there again from
// the survivors' memory and the job ends bitwise equal to the same job without the fault.
// It waited for ever before (the controller logged the slot back and went on waiting for a
// standby).
TEST(Standby, ALostSlotThatComesBackWhileTheJobWaitsTakesItsRanksAgain) {
  const std::string dir = temp_dir("lost-slot-back");
  const std::string cfg = write_config(dir, {{"parallel", "dp: 3"}});
  const std::string sets =
      " --set train.steps=200 --set train.eval_every=0 --set train.global_batch_size=24"
      " --set detect.slow_round_steps=0";
  JobRun ref =
      run_launch_job(temp_dir("lost-slot-back-ref"), "--config " + cfg + " --local 3" + sets);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  pid_t joiner = -1;
  JobRun r = run_launch_job(
      dir,
      "--config " + cfg + " --local 3" + sets +
          " --set recovery.on_no_standby=wait --fault slot_loss@step=30,rank=2"
          " --fault slow@step=0,rank=0,delay_ms=20",
      [&](pid_t) {
        if (joiner > 0) return;
        if (!contains(read_text(dir + "/job.log"), "waiting (recovery.on_no_standby = wait)"))
          return;
        joiner = join_slot(dir, 2, "--config " + cfg + sets);
      });
  int join_status = 0;
  if (joiner > 0) waitpid(joiner, &join_status, 0);
  ASSERT_GT(joiner, 0) << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(WIFEXITED(join_status) && WEXITSTATUS(join_status) == 0);
  EXPECT_EQ(json_number_field(r.report, "steps_completed"), 200);
  EXPECT_EQ(json_string_field(r.report, "param_checksum"),
            json_string_field(ref.report, "param_checksum"));
  const std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_TRUE(json_array_field(inc[0], "slots_evicted").empty()) << inc[0];
  EXPECT_EQ(json_string_field(inc[0], "restored_from"), "memory") << inc[0];
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
}

// recovery.on_no_standby = shrink_dp: a slot is lost with no standby, the job drops that
// data-parallel replica and goes on with more micro-batches per replica (the same samples
// every step, in another reduction order), then grows back when the slot's launcher joins
// again. Every loss stays within 1e-5 (relative) of the fault-free run's.
TEST(Standby, ShrinkDataParallelismAndGrowBackWhenTheSlotRejoins) {
  // Long enough for the lost slot to come back and the job to grow while it trains (rank 0
  // slowed down to make sure of it); short enough that fp32 rounding differences of the
  // shrunk steps cannot grow past the bound (over hundreds of steps they would, as between
  // any two layouts).
  constexpr int kLongSteps = 120;
  std::string dir = temp_dir("shrink");
  std::string cfg = write_config(dir, {{"parallel", "tp: 2 dp: 2"}});
  const std::string steps = " --set train.steps=" + std::to_string(kLongSteps);
  JobRun base = run_job(dir + "", "--config " + cfg + " --nproc 4" + steps);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  const std::vector<double> want = json_array_field(base.report, "losses");

  pid_t joiner = -1;
  JobRun r = run_launch_job(
      dir,
      "--config " + cfg + " --local 2 --workers-per-slot 2" + steps +
          " --set detect.slot_timeout_ms=1000 --set recovery.on_no_standby=shrink_dp"
          " --fault slot_loss@step=6,rank=2 --fault slow@step=6,rank=0,delay_ms=30"
          " --set detect.slow_round_steps=0",  // the slow rank only paces the job
      [&](pid_t) {
        if (joiner > 0) return;
        std::ifstream log(dir + "/job.log");
        std::string text((std::istreambuf_iterator<char>(log)), {});
        if (!contains(text, "data parallelism shrinks")) return;
        joiner = join_slot(dir, 1, "--config " + cfg + " --workers-per-slot 2" + steps);
      });
  int join_status = 0;
  if (joiner > 0) waitpid(joiner, &join_status, 0);
  ASSERT_GT(joiner, 0) << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(WIFEXITED(join_status) && WEXITSTATUS(join_status) == 0)
      << "the rejoined slot's launcher did not end cleanly";
  EXPECT_TRUE(contains(r.output, "grows back to 2 replicas")) << r.output;
  EXPECT_EQ(json_string_field(r.report, "layout"), "tp2 pp1 dp2");
  std::vector<double> got = json_array_field(r.report, "losses");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::abs(got[i] - want[i]) / std::abs(want[i]), 1e-5) << "step " << i;
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_TRUE(contains(json_string_field(inc[0], "action"), "shrink data parallelism to 1"))
      << inc[0];
  // Not a restart from step 0: slot 1 (ranks 2 and 3, replica 1) was lost as rank 2 began
  // step 6, so the surviving replica (ranks 0 and 1, the same ids in the shrunk layout) goes
  // on from its own memory: step 6, or step 5 where rank 3, killed with rank 2, had not yet
  // finished step 5's last collective and the survivors gave that step up (seen in this test:
  // whether rank 3 is done when rank 2 begins step 6 is a matter of timing).
  expect_restored(inc[0], {.min_step = 5,
                           .max_step = 6,
                           .from = "memory",
                           .world = 2,
                           .others = "memory|own_snapshot"});
  // Growing back is no incident; its epoch (2) is in the event log: rebuilt at the step the
  // shrunk job had reached when the slot joined again (whenever that was), never before the
  // shrink's and never from scratch (-1).
  {
    std::string events;
    for (const auto& d : std::filesystem::directory_iterator(dir + "/runs"))
      events += read_text((d.path() / "events.jsonl").string());
    std::istringstream lines(events);
    int grow_step = -2;
    for (std::string line; std::getline(lines, line);)
      if (contains(line, "\"kind\":\"rebuild\"") && contains(line, "\"epoch\":2"))
        grow_step = int(json_number_field(line, "restore_step"));
    EXPECT_GE(grow_step, int(json_number_field(inc[0], "restored_step"))) << events;
    EXPECT_LT(grow_step, kLongSteps) << events;
  }
  // Ranks 0 and 1 (replica 0, slot 0) trained through the shrink and the growth in the same
  // processes; ranks 2 and 3 were lost, then served by the rejoined slot.
  std::vector<std::string> ranks = json_object_array(r.report, "ranks");
  ASSERT_EQ(ranks.size(), 4u);
  for (int k : {0, 1})
    EXPECT_EQ(json_array_field(ranks[size_t(k)], "pids").size(), 1u) << ranks[size_t(k)];
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  EXPECT_TRUE(r.leftover_shm.empty()) << r.output;
}

}  // namespace
}  // namespace keel::test

namespace keel::test {
namespace {

std::string capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// keel-ctl against a running job: status (found without --run) lists the slots (the standby
// with its self-check) and the ranks; inject adds a fault the job then survives like any other.
TEST(KeelCtl, StatusAndInjectOnARunningJob) {
  std::string dir = temp_dir("ctl");
  constexpr const char* kDeadRun = "99999-deadbeef";
  const std::string dead_run = dir + "/runs/" + kDeadRun;
  std::string status, injected;
  int inject_step = 0;
  JobRun r = run_launch_job(
      // The slow rank only paces the job, so that keel-ctl finds it running: not a degrader.
      dir,
      job_args(dir, 1,
               "--set train.steps=300 --fault slow@step=0,rank=0,delay_ms=15 "
               "--set detect.slow_round_steps=0"),
      [&](pid_t) {
        if (!injected.empty()) return;
        std::string run;
        if (std::filesystem::exists(dir + "/runs"))
          for (const auto& d : std::filesystem::directory_iterator(dir + "/runs"))
            if (d.path().filename() != kDeadRun) run = d.path();
        if (run.empty() || !std::filesystem::exists(run + "/controller")) return;
        // A newer run directory whose controller is gone (a job killed with -9): passed over.
        if (!std::filesystem::exists(dead_run + "/controller")) {
          std::filesystem::create_directories(dead_run);
          std::ofstream(dead_run + "/controller") << "tcp://127.0.0.1:9\n";
        }
        // As the README has it: from the directory the job runs in, without --run (keel-ctl
        // finds the newest job under ./runs whose controller answers).
        status = capture("cd " + dir + " && " + bin_dir() + "/keel-ctl status");
        // Ask again until the standby has checked itself and every rank has reported.
        if (!contains(status, "standby (self-check ok") || !contains(status, "rank   7")) {
          status.clear();
          return;
        }
        // A step still ahead of the job: 40 past the one status reported.
        const size_t at = status.find("| step ");
        inject_step =
            std::min(280, (at == std::string::npos ? 0 : std::atoi(status.c_str() + at + 7)) + 40);
        injected =
            capture(bin_dir() + "/keel-ctl inject crash@step=" + std::to_string(inject_step) +
                    ",rank=3 --run " + run);
      });
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(status, "state training")) << status;
  EXPECT_TRUE(contains(status, "slot  4  standby (self-check ok")) << status;
  EXPECT_TRUE(contains(status, "rank   7")) << status;
  EXPECT_TRUE(contains(injected, "injected crash@step=" + std::to_string(inject_step) + ",rank=3"))
      << injected;
  std::vector<std::string> inc = json_object_array(r.report, "incidents");
  ASSERT_EQ(inc.size(), 1u) << r.report;
  EXPECT_EQ(json_string_field(inc[0], "kind"), "crash") << inc[0];
  EXPECT_EQ(json_number_field(inc[0], "rank"), 3) << inc[0];
  // Restarted in its slot at the injected step: its own snapshot, the others' memory.
  expect_restored(inc[0], {.step = inject_step,
                           .from = "memory",
                           .world = 8,
                           .ranks = {{3, "own_snapshot"}},
                           .others = "memory"});
  EXPECT_EQ(r.leftover_processes, 0) << r.output;
  // Once the job has ended, status needs no controller; a command that does is refused.
  const std::string ended = capture("cd " + dir + " && " + bin_dir() + "/keel-ctl status");
  EXPECT_TRUE(contains(ended, "state ended | exit 0")) << ended;
  const std::string late =
      capture("cd " + dir + " && " + bin_dir() + "/keel-ctl inject crash@step=299,rank=1");
  EXPECT_TRUE(contains(late, "keel-ctl: error: no running job under ./runs answers")) << late;
}

}  // namespace
}  // namespace keel::test
