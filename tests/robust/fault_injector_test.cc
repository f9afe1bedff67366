// FaultInjector: each fault fires once per job even across a "restarted" rank, every firing
// is recorded before it acts, and each kind does what it says (crash, exit, freeze and spin
// in forked children, slow by the clock, nan on the local metrics of its step only).
#include "robust/fault_injector.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <new>
#include <thread>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "parallel/hash_store.h"
#include "parallel/tcp_store.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
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

// Fields of /proc/PID/stat after the command: [0] is the state letter ('R', 'S', 'T' for
// stopped by a signal, ...), [11] utime and [12] stime in clock ticks. Empty once it is gone.
std::vector<std::string> proc_stat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  size_t close = text.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream fields(text.substr(close + 1));
  std::vector<std::string> out;
  for (std::string f; fields >> f;) out.push_back(f);
  return out;
}
char proc_state(pid_t pid) {
  auto f = proc_stat(pid);
  return f.empty() ? 0 : f[0][0];
}
long proc_cpu_ticks(pid_t pid) {
  auto f = proc_stat(pid);
  return f.size() > 12 ? std::stol(f[11]) + std::stol(f[12]) : -1;
}

using test::eventually;

// What a child shares with the test: a heartbeat from a thread of its own (as the progress
// reporter's), and whether its main thread came back from the fault.
struct Shared {
  std::atomic<int64_t> beats{0};
  std::atomic<int> returned{0};
};

// Anonymous shared memory that outlives fork, unmapped at the end of the test.
class SharedBlock {
 public:
  SharedBlock() {
    void* p =
        ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    KEEL_CHECK(p != MAP_FAILED, "mmap: ", std::strerror(errno));
    s_ = new (p) Shared;
  }
  ~SharedBlock() { ::munmap(s_, sizeof(Shared)); }
  Shared* operator->() { return s_; }
  Shared& operator*() { return *s_; }

 private:
  Shared* s_;
};

// In a child: a thread that beats every millisecond until the process ends.
void start_heartbeat(Shared& shared) {
  std::thread([&shared] {
    for (;;) {
      shared.beats.fetch_add(1);
      std::this_thread::sleep_for(1ms);
    }
  }).detach();
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
  // What the injector decided, not what the scheduler did (a loaded machine switches a
  // thread out whenever it likes).
  first.before_step(1);
  EXPECT_EQ(first.slowdown(1).count(), 0);  // before S: not slow
  // Fires at S, and stays slow after: the step sleeps, at least the delay (sleep_for never
  // ends early, so this lower bound holds however loaded the machine is).
  EXPECT_GE(millis_of([&] { first.before_step(2); }), 100);
  EXPECT_EQ(first.slowdown(2).count(), 100);
  EXPECT_EQ(first.slowdown(3).count(), 100);
  EXPECT_GE(millis_of([&] { first.before_step(3); }), 100);

  float metrics[2] = {2.5f, 1.0f};
  first.on_local_metrics(2, metrics);  // not the nan's step
  EXPECT_EQ(metrics[0], 2.5f);
  first.on_local_metrics(3, metrics);
  EXPECT_TRUE(std::isnan(metrics[0]));
  EXPECT_EQ(metrics[1], 1.0f);

  // The rank is restarted and replays steps 2 and 3: nothing fires again.
  FaultInjector restarted(schedule, 1, store);
  restarted.before_step(2);
  restarted.before_step(3);
  EXPECT_EQ(restarted.slowdown(2).count(), 0);
  EXPECT_EQ(restarted.slowdown(3).count(), 0);
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
  const auto recorded = get_message<store::Injection>(*store, keys::injection_key(0), 1s);
  EXPECT_EQ(recorded.kind(), "slow");
  EXPECT_EQ(recorded.rank(), 1);
  EXPECT_EQ(recorded.step(), 2);
}

// An sdc flip lands on a value something computed. A gradient shard of an embedding is mostly
// zero rows (tokens the batch did not use): a flipped mantissa bit of a zero is a denormal the
// optimizer absorbs, so a defect there would vanish at some steps and show at others (what
// once made a stop-time replay miss the defective machine). At every step the flip must
// change exactly one value, a normal one, by an eighth of itself; and the same way each time.
TEST(FaultInjector, SdcFlipChangesAComputedValueAtEveryStep) {
  auto store = std::make_shared<HashStore>();
  FaultInjector inj(schedule_of({"sdc@step=0,rank=0,target=grad"}), 0, store);
  inj.before_step(0);
  constexpr size_t kRows = 128, kWidth = 32;
  std::vector<float> grad(kRows * kWidth, 0.0f);
  for (size_t r = 0; r < kRows; r += 13)  // a few used rows, the rest zero
    for (size_t c = 0; c < kWidth; ++c) grad[r * kWidth + c] = 1e-4f * float(c + 1);
  for (int64_t step = 0; step < 1000; ++step) {
    std::vector<float> got = grad, again = grad;
    inj.on_computed(step, TensorClass::kGrad, got.data(), got.size(), false);
    inj.on_computed(step, TensorClass::kGrad, again.data(), again.size(), true);
    EXPECT_EQ(got, again) << "step " << step;
    size_t changed = 0;
    for (size_t i = 0; i < grad.size(); ++i) {
      if (got[i] == grad[i]) continue;
      ++changed;
      EXPECT_NE(grad[i], 0.0f) << "step " << step << " flipped a zero at " << i;
      EXPECT_NEAR(std::fabs(got[i] - grad[i]) / std::fabs(grad[i]), 0.125, 0.0626)
          << "step " << step << " at " << i;
    }
    ASSERT_EQ(changed, 1u) << "step " << step;
  }
  // Another target is left alone.
  std::vector<float> act = grad;
  inj.on_computed(5, TensorClass::kActivation, act.data(), act.size(), false);
  EXPECT_EQ(act, grad);
}

TEST(FaultInjector, HangWithoutWrapIsAnError) {
  FaultInjector inj(schedule_of({"hang@step=1,rank=0"}), 0, std::make_shared<HashStore>());
  inj.before_step(0);
  EXPECT_THROW(inj.before_step(1), Error);
  FaultInjector held(schedule_of({"hang_in_collective@step=1,rank=0"}), 0,
                     std::make_shared<HashStore>());
  held.before_step(0);
  EXPECT_THROW(held.before_step(1), Error);
}

TEST(FaultInjector, FreezeStopsTheWholeProcessOnce) {
  TcpStoreServer server;
  SharedBlock shared;
  auto schedule = schedule_of({"freeze@step=1,rank=0"});
  auto run = [&](int) {
    start_heartbeat(*shared);
    auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 20s);
    FaultInjector inj(schedule, 0, store);
    for (int64_t s = 0; s < 3; ++s) inj.before_step(s);
    shared->returned = 1;
    return test::kOk;
  };
  {
    RankProcs first(1, run);
    ASSERT_TRUE(eventually([&] { return proc_state(first.pid(0)) == 'T'; }))
        << "state " << proc_state(first.pid(0));
    EXPECT_EQ(shared->returned.load(), 0);
    // Every thread is stopped, the heartbeat thread too: that is what the controller sees.
    const int64_t beats = shared->beats.load();
    EXPECT_FALSE(eventually([&] { return shared->beats.load() != beats; }, 300ms));
    EXPECT_EQ(proc_state(first.pid(0)), 'T');
    // Continued from outside, it goes on from where it stopped.
    first.kill(0, SIGCONT);
    EXPECT_EQ(first.wait(0), test::kOk);
    EXPECT_EQ(shared->returned.load(), 1);
  }
  {
    shared->returned = 0;
    RankProcs restarted(1, run);  // replays step 1: the fault already fired in this job
    EXPECT_EQ(restarted.wait(0), test::kOk);
    EXPECT_EQ(shared->returned.load(), 1);
  }
  TcpStore store("127.0.0.1", server.port(), 20s);
  auto records = FaultInjector::read_injections(store);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, "freeze");
  EXPECT_EQ(records[0].rank, 0);
  EXPECT_EQ(records[0].step, 1);
}

TEST(FaultInjector, SpinLoopsInComputeForeverWhileOtherThreadsLive) {
  TcpStoreServer server;
  SharedBlock shared;
  auto schedule = schedule_of({"spin@step=2,rank=1"});
  auto run = [&](int) {
    start_heartbeat(*shared);
    auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 20s);
    FaultInjector inj(schedule, 1, store);
    for (int64_t s = 0; s < 4; ++s) inj.before_step(s);
    shared->returned = 1;
    return test::kOk;
  };
  {
    RankProcs first(1, run);
    TcpStore store("127.0.0.1", server.port(), 20s);
    ASSERT_TRUE(eventually([&] { return !FaultInjector::read_injections(store).empty(); }));
    // It burns CPU (a second of it, at least) and never comes back, while its heartbeat
    // thread goes on.
    const pid_t pid = first.pid(0);
    const long cpu = proc_cpu_ticks(pid);
    const long hz = ::sysconf(_SC_CLK_TCK);
    const int64_t beats = shared->beats.load();
    EXPECT_TRUE(eventually([&] { return proc_cpu_ticks(pid) >= cpu + hz; }))
        << "cpu ticks " << cpu << " -> " << proc_cpu_ticks(pid);
    EXPECT_TRUE(eventually([&] { return shared->beats.load() > beats + 10; }));
    EXPECT_EQ(shared->returned.load(), 0);
    EXPECT_NE(proc_state(pid), 'T');
    EXPECT_EQ(first.wait(0, 200ms), test::kExitNotFinished);  // still there: killed now
  }
  {
    RankProcs restarted(1, run);
    EXPECT_EQ(restarted.wait(0), test::kOk);
    EXPECT_EQ(shared->returned.load(), 1);
  }
  TcpStore store("127.0.0.1", server.port(), 20s);
  auto records = FaultInjector::read_injections(store);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, "spin");
  EXPECT_EQ(records[0].rank, 1);
  EXPECT_EQ(records[0].step, 2);
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
  // Said to be injected, so that the run it ends is not taken for a real failure; said once,
  // as the last line (after the log line's prefix, which ends in "] ").
  const std::string said =
      "] rank 0: injected exit fault at step 2 (code 77): CUDA error: an illegal memory access\n";
  ASSERT_GE(text.size(), said.size()) << text;
  EXPECT_EQ(text.substr(text.size() - said.size()), said) << text;
  EXPECT_EQ(text.find("injected exit fault"), text.rfind("injected exit fault")) << text;

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
