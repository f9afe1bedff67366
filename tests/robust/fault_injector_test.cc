// FaultInjector: each fault fires once per job even across a "restarted" rank, every firing
// is recorded before it acts, and each kind does what it says (crash and exit in forked
// children, slow by the clock, nan on the local metrics of its step only).
#include "robust/fault_injector.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>

#include "parallel/hash_store.h"
#include "parallel/tcp_store.h"
#include "robust/fault_spec.h"
#include "tests/parallel/rank_procs.h"
#include "tests/test_expect.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using test::RankProcs;

faults::FaultSchedule schedule_of(const std::vector<std::string>& flags) {
  FaultPlan plan;
  for (const auto& f : flags) add_fault_flag(&plan, f);
  return plan.schedule;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Wall time of fn in milliseconds.
template <typename F>
double millis_of(F&& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

TEST(FaultInjector, SlowAndNanFireOncePerJobAcrossARestart) {
  auto store = std::make_shared<HashStore>();
  auto schedule =
      schedule_of({"slow@step=2,rank=1,delay_ms=100", "nan@step=3,rank=1", "nan@step=3,rank=0"});
  double t0 = unix_now();
  FaultInjector first(schedule, 1, store);
  EXPECT_LT(millis_of([&] { first.before_step(1); }), 50);   // before S: not slow
  EXPECT_GE(millis_of([&] { first.before_step(2); }), 100);  // fires at S
  EXPECT_GE(millis_of([&] { first.before_step(3); }), 100);  // and stays slow after

  float metrics[2] = {2.5f, 1.0f};
  first.on_local_metrics(2, metrics);  // not the nan's step
  EXPECT_EQ(metrics[0], 2.5f);
  first.on_local_metrics(3, metrics);
  EXPECT_TRUE(std::isnan(metrics[0]));
  EXPECT_EQ(metrics[1], 1.0f);

  // The rank is restarted and replays steps 2 and 3: nothing fires again.
  FaultInjector restarted(schedule, 1, store);
  EXPECT_LT(millis_of([&] { restarted.before_step(2); }), 50);
  EXPECT_LT(millis_of([&] { restarted.before_step(3); }), 50);
  metrics[0] = 2.5f;
  restarted.on_local_metrics(3, metrics);
  EXPECT_EQ(metrics[0], 2.5f);

  // Rank 0 has its own nan.
  FaultInjector rank0(schedule, 0, store);
  rank0.before_step(2);
  metrics[0] = 1.5f;
  rank0.on_local_metrics(3, metrics);
  EXPECT_TRUE(std::isnan(metrics[0]));

  auto records = FaultInjector::read_injections(*store);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].kind, "slow");
  EXPECT_EQ(records[0].rank, 1);
  EXPECT_EQ(records[0].step, 2);
  EXPECT_EQ(records[1].kind, "nan");
  EXPECT_EQ(records[1].rank, 1);
  EXPECT_EQ(records[1].step, 3);
  EXPECT_EQ(records[2].kind, "nan");
  EXPECT_EQ(records[2].rank, 0);
  for (const auto& r : records) {
    EXPECT_GE(r.time, t0 - 1);
    EXPECT_LE(r.time, unix_now() + 1);
  }
  EXPECT_EQ(store->get("inject/0", 1s).rfind("slow 1 2 ", 0), 0u);
}

TEST(FaultInjector, HangWithoutWrapIsAnError) {
  FaultInjector inj(schedule_of({"hang@step=1,rank=0"}), 0, std::make_shared<HashStore>());
  inj.before_step(0);
  EXPECT_THROW(inj.before_step(1), Error);
}

TEST(FaultInjector, ExitPrintsItsMessageAndExitsWithItsCodeOnce) {
  TcpStoreServer server;
  std::string err = test::temp_dir("fault_exit") + "/stderr.txt";
  auto schedule =
      schedule_of({"exit@step=2,rank=0,code=77,message=CUDA error: an illegal memory access"});
  double t0 = unix_now();
  auto run = [&](int) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 20s);
    int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0 || ::dup2(fd, 2) < 0) return test::kWrong;
    FaultInjector inj(schedule, 0, store);
    for (int64_t s = 0; s < 4; ++s) inj.before_step(s);
    return test::kOk;
  };
  {
    RankProcs first(1, run);
    EXPECT_EQ(first.wait(0), 77);
  }
  {
    RankProcs restarted(1, run);  // replays step 2: the fault already fired in this job
    EXPECT_EQ(restarted.wait(0), test::kOk);
  }
  std::ifstream in(err);
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(text, "CUDA error: an illegal memory access\n");

  TcpStore store("127.0.0.1", server.port(), 20s);
  auto records = FaultInjector::read_injections(store);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, "exit");
  EXPECT_EQ(records[0].rank, 0);
  EXPECT_EQ(records[0].step, 2);
  EXPECT_GE(records[0].time, t0 - 1);
}

TEST(FaultInjector, CrashDiesBySigkillAfterRecordingItself) {
  TcpStoreServer server;
  auto schedule = schedule_of({"crash@step=1,rank=3"});
  auto run = [&](int) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 20s);
    FaultInjector inj(schedule, 3, store);
    for (int64_t s = 0; s < 3; ++s) inj.before_step(s);
    return test::kOk;
  };
  {
    RankProcs first(1, run);
    EXPECT_EQ(first.wait(0), 128 + SIGKILL);
  }
  {
    RankProcs restarted(1, run);
    EXPECT_EQ(restarted.wait(0), test::kOk);
  }
  TcpStore store("127.0.0.1", server.port(), 20s);
  auto records = FaultInjector::read_injections(store);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, "crash");
  EXPECT_EQ(records[0].rank, 3);
  EXPECT_EQ(records[0].step, 1);
}

}  // namespace
}  // namespace keel
