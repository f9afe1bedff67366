// The stop-time SDC replay's worker (launcher/worker/replay_worker.h) as real keel-worker
// processes. The test plays the parked job: BackupServers in this process hold the snapshots of
// step kStep of a TP1×PP2×DP2 job of the test GPT, registered where the job's workers register
// theirs. Replay groups of two workers load that state, run the one step and publish a
// digest: groups on healthy machines must agree bit for bit, a group on a machine recorded
// as defective must not, and a replay without a source must say what is missing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/backup_placement.h"
#include "ckpt/backup_service.h"
#include "ckpt/snapshot_region.h"
#include "launcher/recovery_protocol.h"
#include "model/plugin_loader.h"
#include "model/trainer.h"
#include "parallel/hash_store.h"
#include "parallel/job_key.h"
#include "parallel/tcp_store.h"
#include "proto/config_loader.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/fault_injector.h"
#include "robust/fault_spec.h"
#include "test_paths.h"
#include "worker_harness.h"

extern char** environ;

namespace keel::test {
namespace {

using namespace std::chrono_literals;

constexpr int kStep = 3;   // the snapshots' step: the replay runs step 3 (0-based)
constexpr int kEpoch = 7;  // the parked job's epoch
constexpr int kDp = 2;

class ReplayWorkerTest : public testing::Test {
 protected:
  void SetUp() override {
    store = std::make_shared<TcpStore>("127.0.0.1", server.port());
    const config::JobConfig cfg = load_config(cfg_path, {});
    const Topology topo(cfg.parallel().tp(), cfg.parallel().pp(), cfg.parallel().dp());
    ASSERT_EQ(topo.world_size(), 4);
    auto plugin = Plugin::load(cfg.model().plugin());
    for (int h = 0; h < topo.world_size(); ++h) {
      holders.push_back(std::make_unique<BackupServer>(job, h));
      store::Endpoint e;
      e.set_address(holders.back()->address());
      set_message(*store, keys::backup_addr_key(kEpoch, h), e);
    }
    // Every rank's step-kStep state, pushed to its holder as its snapshotter would. Moments
    // that are not zero, so a changed gradient changes the update, not only its sign.
    for (int x = 0; x < topo.world_size(); ++x) {
      auto state = make_train_state(cfg, backend.get(), *plugin, topo, x);
      state->params().init(cfg.train().seed());
      std::vector<StateSpan> spans = state->spans();
      backend->fill(spans[1].data, spans[1].floats, 1e-4f);
      backend->fill(spans[2].data, spans[2].floats, 1e-6f);
      state->set_step(kStep);
      regions.push_back(SnapshotRegion::open_or_create(
          snapshot_segment_name(job, x), state->bytes(), state->layout_fingerprint(), x));
      regions.back()->write(*state, kStep);
      const int h = backup_holder(topo, x, replicas_hold_backups(topo, false)).holder;
      BackupClient client(holders[size_t(h)]->address(), 5s);
      ASSERT_EQ(client.push(*regions.back(), kStep), state->bytes());
    }
  }

  void TearDown() override {
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
    holders.clear();
    regions.clear();
    unlink_job_segments(job);
    EXPECT_TRUE(job_segments(job).empty());
  }

  // Starts replay group `key` (two workers, on machines `slots`) as the controller and the
  // agent would: its task in the store, the key in the workers' environment.
  std::vector<pid_t> start_group(const std::string& key, int step, int epoch,
                                 std::vector<int> slots, std::vector<std::string> extra = {}) {
    store::ReplayTask task;
    task.set_step(step);
    task.set_epoch(epoch);
    task.set_source_dp(kDp);
    set_message(*store, keys::replay_task_key(key), task);
    std::vector<pid_t> group;
    for (int g = 0; g < 2; ++g) {
      std::vector<std::string> env;
      for (char** e = environ; *e; ++e) env.push_back(*e);
      env.push_back("KEEL_REPLAY=" + key);
      env.push_back(detail::concat("KEEL_RANK=", g));
      env.push_back("KEEL_WORLD_SIZE=2");
      env.push_back("KEEL_LOCAL_WORLD_SIZE=2");
      env.push_back(detail::concat("KEEL_STORE_ADDR=127.0.0.1:", server.port()));
      env.push_back("KEEL_JOB_ID=" + job);
      env.push_back(detail::concat("KEEL_SLOT=", slots[size_t(g)]));
      env.push_back("KEEL_SUPERVISED=1");  // what the controller sets; a replay ignores it
      env.push_back("KEEL_JOB_SECRET=" + process_job_key().hex());  // the job's key
      std::vector<std::string> args = {bin_dir() + "/keel-worker", "--config", cfg_path};
      for (const auto& a : extra) args.push_back(a);
      std::vector<char*> argv, envp;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      for (auto& e : env) envp.push_back(e.data());
      envp.push_back(nullptr);
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      const std::string log = log_path(key, g);
      posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&fa, 1, 2);
      pid_t pid = -1;
      EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
      posix_spawn_file_actions_destroy(&fa);
      group.push_back(pid);
      pids.push_back(pid);
    }
    return group;
  }

  std::string log_path(std::string key, int g) const {
    for (char& c : key)
      if (c == '/') c = '_';
    return detail::concat(dir, "/", key, "-", g, ".log");
  }
  std::string logs(const std::string& key) const {
    return read_text(log_path(key, 0)) + read_text(log_path(key, 1));
  }

  // Waits (deadline) for every started worker; their exit codes by pid.
  std::map<pid_t, int> wait_all(std::chrono::seconds deadline = 180s) {
    std::map<pid_t, int> codes;
    const auto end = std::chrono::steady_clock::now() + deadline;
    while (!pids.empty() && std::chrono::steady_clock::now() < end) {
      int status = 0;
      const pid_t p = ::waitpid(-1, &status, WNOHANG);
      if (p <= 0) {
        ::usleep(20000);  // poll: a child exiting does not wake us otherwise
        continue;
      }
      codes[p] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::erase(pids, p);
    }
    for (pid_t p : pids) codes[p] = -1;  // still running: TearDown kills them
    return codes;
  }

  // The group's answer (empty when it gave none).
  store::ReplayResult result(const std::string& key) {
    return try_get_message<store::ReplayResult>(*store, keys::replay_result_key(key))
        .value_or(store::ReplayResult{});
  }

  std::string dir = temp_dir("replay");
  std::string cfg_path = write_config(dir, {{"parallel", "pp: 2 dp: 2"}});
  std::string job = detail::concat("replaytest", ::getpid());
  TcpStoreServer server{"127.0.0.1", 0};
  std::shared_ptr<TcpStore> store;
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  std::vector<std::unique_ptr<BackupServer>> holders;
  std::vector<std::unique_ptr<SnapshotRegion>> regions;
  std::vector<pid_t> pids;
};

// Two groups replaying the same state on healthy machines agree bitwise; a third, whose
// machine 5 the job recorded as defective (a persistent gradient flip), differs. The loss is
// the forward's and equal everywhere: the defect shows in the state after the update only.
TEST_F(ReplayWorkerTest, HealthyGroupsAgreeDefectiveMachineDiffers) {
  FaultInjector::record_machine(*store, keys::machine_defect_key(5),
                                parse_fault_flag("sdc@step=1,rank=3,target=grad"));
  const auto a = start_group("replay/1/0/0", kStep, kEpoch, {0, 1});
  const auto b = start_group("replay/1/0/1", kStep, kEpoch, {2, 3});
  const auto c = start_group("replay/1/0/2", kStep, kEpoch, {4, 5});
  const auto codes = wait_all();
  for (const auto* grp : {&a, &b, &c})
    for (pid_t p : *grp) EXPECT_EQ(codes.at(p), 0);
  const std::string da = result("replay/1/0/0").digest(), db = result("replay/1/0/1").digest(),
                    dc = result("replay/1/0/2").digest();
  ASSERT_EQ(da.size(), 16u) << logs("replay/1/0/0");
  EXPECT_EQ(da, db) << logs("replay/1/0/0") << logs("replay/1/0/1");
  ASSERT_EQ(dc.size(), 16u) << logs("replay/1/0/2");
  EXPECT_NE(dc, da) << logs("replay/1/0/2");
  EXPECT_TRUE(contains(logs("replay/1/0/2"), "defective machine")) << logs("replay/1/0/2");
  EXPECT_FALSE(contains(logs("replay/1/0/0"), "defective machine")) << logs("replay/1/0/0");
  const double loss = result("replay/1/0/0").loss();
  EXPECT_GT(loss, 0.0);
  EXPECT_EQ(result("replay/1/0/1").loss(), loss);
  EXPECT_EQ(result("replay/1/0/2").loss(), loss);
  for (const char* k : {"replay/1/0/0", "replay/1/0/1", "replay/1/0/2"})
    EXPECT_EQ(result(k).error(), "") << logs(k);
}

// The job stopped while a holder's snapshot of the newest step was still being written: the
// holders hold step kStep only, the job's ranks kStep + 1 in their own segments too. A replay
// of kStep + 1 passes the holder over and fetches from the rank's own server, and says so.
TEST_F(ReplayWorkerTest, HolderBehindTheRankIsPassedOver) {
  const config::JobConfig cfg = load_config(cfg_path, {});
  const Topology topo(cfg.parallel().tp(), cfg.parallel().pp(), cfg.parallel().dp());
  auto plugin = Plugin::load(cfg.model().plugin());
  for (int x = 0; x < topo.world_size(); ++x) {
    auto state = make_train_state(cfg, backend.get(), *plugin, topo, x);
    state->params().init(cfg.train().seed());
    state->set_step(kStep + 1);
    regions[size_t(x)]->write(*state, kStep + 1);
  }
  const auto a = start_group("replay/3/0/0", kStep + 1, kEpoch, {0, 1});
  const auto b = start_group("replay/3/0/1", kStep + 1, kEpoch, {2, 3});
  const auto codes = wait_all();
  for (const auto* grp : {&a, &b})
    for (pid_t p : *grp) EXPECT_EQ(codes.at(p), 0);
  const std::string da = result("replay/3/0/0").digest();
  ASSERT_EQ(da.size(), 16u) << logs("replay/3/0/0");
  EXPECT_EQ(result("replay/3/0/1").digest(), da) << logs("replay/3/0/1");
  EXPECT_EQ(result("replay/3/0/0").error(), "") << logs("replay/3/0/0");
  // The holder was asked first and held only kStep; the rank's own slot answered.
  const std::string log = logs("replay/3/0/0");
  for (int pp = 0; pp < topo.pp(); ++pp) {
    const int x = topo.rank({0, pp, 0});
    EXPECT_TRUE(contains(log, detail::concat("step ", kStep + 1, " from backup held by rank ", x)))
        << log;
  }
}

// A replay that cannot get its state publishes what is missing and exits 1, in time: no
// holder registered in the epoch, a holder without the step, and ZeRO-1 refused outright.
TEST_F(ReplayWorkerTest, MissingSourceIsNamed) {
  const std::vector<std::string> fast = {"--set", "parallel.comm_timeout_ms=1500"};
  start_group("replay/2/0/0", kStep, kEpoch + 1, {0, 1}, fast);
  start_group("replay/2/0/1", kStep + 5, kEpoch, {2, 3}, fast);
  std::vector<std::string> zero1 = fast;
  zero1.insert(zero1.end(), {"--set", "parallel.zero1=true"});
  start_group("replay/2/0/2", kStep, kEpoch, {4, 5}, zero1);
  const auto codes = wait_all(120s);
  for (const auto& [pid, code] : codes) EXPECT_EQ(code, 1) << "pid " << pid;

  const std::string no_holder = result("replay/2/0/0").error();
  EXPECT_TRUE(contains(no_holder, "no backup server of rank")) << no_holder << logs("replay/2/0/0");
  EXPECT_TRUE(contains(no_holder, "backup_addr/8/")) << no_holder;
  const std::string no_step = result("replay/2/0/1").error();
  EXPECT_TRUE(contains(no_step, "step 8")) << no_step << logs("replay/2/0/1");
  const std::string z = result("replay/2/0/2").error();
  EXPECT_TRUE(contains(z, "zero1")) << z << logs("replay/2/0/2");
  for (const char* k : {"replay/2/0/0", "replay/2/0/1", "replay/2/0/2"})
    EXPECT_EQ(result(k).digest(), "") << k;
}

// The machine's defect in the store: recorded by a process that claims a persistent sdc
// fault on a known machine (not by a `once` one), and armed by a later process there so that
// it flips the same bit of the same value.
TEST(MachineDefect, RecordedOnClaimAndArmedElsewhere) {
  auto store = std::make_shared<HashStore>();
  faults::FaultSchedule sched;
  *sched.add_fault() = parse_fault_flag("sdc@step=2,rank=0,target=param");
  *sched.add_fault() = parse_fault_flag("sdc@step=2,rank=1,target=grad,once");
  FaultInjector claimed(sched, 0, store), transient(sched, 1, store);
  claimed.set_machine(3);
  transient.set_machine(4);
  claimed.before_step(2);
  transient.before_step(2);
  const std::optional<faults::Fault> recorded = FaultInjector::machine_defect(*store, 3);
  ASSERT_TRUE(recorded.has_value());
  EXPECT_EQ(recorded->SerializeAsString(),
            parse_fault_flag("sdc@step=2,rank=0,target=param").SerializeAsString());
  EXPECT_FALSE(FaultInjector::machine_defect(*store, 4).has_value());

  std::vector<float> want(100, 1.0f), got(100, 1.0f), healthy(100, 1.0f);
  claimed.on_computed(7, TensorClass::kParam, want.data(), want.size(), false);
  FaultInjector replay(faults::FaultSchedule{}, 0, store),
      elsewhere(faults::FaultSchedule{}, 0, store);
  EXPECT_TRUE(replay.arm_machine_defects(3));
  EXPECT_FALSE(elsewhere.arm_machine_defects(4));
  replay.on_computed(7, TensorClass::kParam, got.data(), got.size(), false);
  replay.on_computed(7, TensorClass::kGrad, healthy.data(), healthy.size(), false);
  elsewhere.on_computed(7, TensorClass::kParam, healthy.data(), healthy.size(), false);
  EXPECT_NE(want, std::vector<float>(100, 1.0f));
  EXPECT_EQ(got, want);  // the same bit of the same value
  EXPECT_EQ(healthy, std::vector<float>(100, 1.0f));
  const int64_t fired = store->add(keys::kInjectCount, 0);
  replay.before_step(7);  // an armed defect is no fault to claim
  EXPECT_EQ(store->add(keys::kInjectCount, 0), fired);
}

}  // namespace
}  // namespace keel::test
