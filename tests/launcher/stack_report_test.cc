// collect_stacks end to end on LocalHost: three real ranks (this test binary, run again),
// two waiting in a "collective" and one spinning; the spinner must be named, and the files
// written. And the failures a caller must see as values.
#include "launcher/controller/stack_report.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "launcher/agent/agent.h"
#include "launcher/controller/agent_host.h"
#include "launcher/control_plane.h"
#include "launcher/controller/local_host.h"

namespace keel_test {
// What the ranks run; the names are what the stacks must show. noinline, and work after
// each call, so that the frames stay.
struct FakeCommunicator {
  [[gnu::noinline]] static void all_reduce() {
    while (true) {
      ::pause();
      asm volatile("" ::: "memory");
    }
  }
};
[[gnu::noinline]] void spin_in_compute() {
  volatile uint64_t x = 1;
  while (true) x = x * 6364136223846793005ull + 1;
}
}  // namespace keel_test

namespace keel {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The body of a rank: only when started by the test below (KEEL_TEST_STACK_RANK set).
TEST(StackReportRank, Body) {
  const char* role = std::getenv("KEEL_TEST_STACK_RANK");
  if (!role) GTEST_SKIP() << "runs only as a rank of StackReport.LocalRanks";
  if (std::string(role) == "spin") keel_test::spin_in_compute();
  keel_test::FakeCommunicator::all_reduce();
}

// Removes a test's directory however the test ends.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / (name + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(StackReport, LocalRanksTheSpinnerIsNamedAndEverythingIsWritten) {
  const TempDir tmp("keel-stacks-");
  const fs::path dir = tmp.path / "out";
  LocalHost host({"keel_launcher_test", "--gtest_filter=StackReportRank.Body"}, 3,
                 "stacktest-" + std::to_string(getpid()));
  for (int r = 0; r < 3; ++r) host.spawn(r, {{"KEEL_TEST_STACK_RANK", r == 1 ? "spin" : "wait"}});

  // The ranks need a moment to reach their functions: capture until they have.
  control::StacksReply reply;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  do {
    reply = collect_stacks(host, dir.string(), std::chrono::seconds(2));
  } while (!(reply.summary().find("spin_in_compute") != std::string::npos &&
             reply.summary().find("2 rank(s) 0,2 (waiting)") != std::string::npos) &&
           Clock::now() < deadline);
  host.stop_all(SIGKILL, std::chrono::seconds(2));
  host.finish();

  EXPECT_TRUE(reply.ok()) << reply.message();
  EXPECT_EQ(reply.dir(), dir.string());
  ASSERT_EQ(reply.culprits_size(), 1) << reply.summary();
  EXPECT_EQ(reply.culprits(0), 1);
  EXPECT_NE(reply.message().find("rank 1's main thread is in keel_test::spin_in_compute() <- "),
            std::string::npos)
      << reply.message();
  EXPECT_NE(reply.message().find("while 2 ranks wait in FakeCommunicator::all_reduce()"),
            std::string::npos)
      << reply.message();
  for (int r = 0; r < 3; ++r) {
    const std::string text = slurp(dir / ("rank" + std::to_string(r) + ".txt"));
    EXPECT_EQ(text.rfind("rank " + std::to_string(r) + ", pid ", 0), 0u) << text;
    EXPECT_NE(text.find(r == 1 ? "keel_test::spin_in_compute()+0x"
                               : "keel_test::FakeCommunicator::all_reduce()+0x"),
              std::string::npos)
        << text;
  }
  EXPECT_EQ(slurp(dir / "summary.txt"), reply.summary());
}

TEST(StackReport, AgentsCaptureTheirWorkersOverTheControlPlane) {
  // One slot of two workers (plain sleeps), its agent on a thread, the controller's side
  // pumped here: the Command stacks / Event stacks round trip.
  const TempDir tmp("keel-agent-stacks-");
  const fs::path dir = tmp.path;
  ControlServer server("127.0.0.1", 0);
  AgentHost host(&server, nullptr, /*world=*/2, /*workers_per_slot=*/2, /*slots=*/1,
                 /*standby_slots=*/0, {"/bin/sleep", "60"}, {}, std::chrono::seconds(5));
  host.set_pump([&] {
    while (auto in = server.poll(std::chrono::milliseconds(0)))
      host.on_message(in->identity, in->msg);
  });
  AgentOptions o;
  o.slot = 0;
  o.workers = 2;
  o.host = "127.0.0.1";
  o.controller = server.endpoint();
  o.log_dir = dir.string();
  o.job = "stacktest-" + std::to_string(getpid());
  volatile int stop = 0;
  std::thread agent([&] { Agent(o).run(&stop); });
  ASSERT_TRUE(host.wait_for_slots(std::chrono::seconds(10), nullptr));
  host.spawn(0, {});
  host.spawn(1, {});

  std::map<int, control::RankStacks> stacks;
  auto asleep = [&](int r) {
    return stacks.count(r) && stacks[r].threads_size() > 0 &&
           stacks[r].threads(0).frames_size() > 0 &&
           stacks[r].threads(0).frames(0).find("nanosleep") != std::string::npos;
  };
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  do {
    stacks = host.capture_stacks(std::chrono::seconds(1));
  } while (!(asleep(0) && asleep(1)) && Clock::now() < deadline);
  EXPECT_TRUE(asleep(0) && asleep(1)) << (stacks.count(0) ? stacks[0].DebugString() : "no rank 0");
  EXPECT_EQ(stacks.size(), 2u);
  for (const auto& [r, m] : stacks) {
    EXPECT_EQ(m.rank(), r);
    EXPECT_GT(m.pid(), 0);
    EXPECT_EQ(m.error(), "");
  }

  const control::StacksReply reply =
      collect_stacks(host, (dir / "stacks").string(), std::chrono::seconds(1));
  EXPECT_TRUE(reply.ok()) << reply.message();
  EXPECT_EQ(reply.culprits_size(), 0);
  EXPECT_NE(reply.message().find("all 2 ranks' main threads are in "), std::string::npos)
      << reply.message();
  EXPECT_TRUE(fs::exists(dir / "stacks" / "rank0.txt"));
  EXPECT_TRUE(fs::exists(dir / "stacks" / "rank1.txt"));

  host.stop_all(SIGKILL, std::chrono::milliseconds(0));
  host.finish();
  stop = 1;  // in case the shutdown did not arrive
  agent.join();
}

// A host with canned answers, for the paths that need no processes.
class CannedHost : public RankHost {
 public:
  std::map<int, control::RankStacks> stacks;
  void spawn(int, const std::map<std::string, std::string>&) override {}
  void kill(int) override {}
  std::optional<RankExit> poll_exit() override { return std::nullopt; }
  void stop_all(int, std::chrono::milliseconds) override {}
  std::map<int, policy::Holdings> survey(const Topology&, bool) override { return {}; }
  void finish() override {}
  std::map<int, control::RankStacks> capture_stacks(std::chrono::milliseconds) override {
    return stacks;
  }
};

TEST(StackReport, NothingCapturedIsNotOk) {
  CannedHost host;
  const control::StacksReply reply =
      collect_stacks(host, "/nonexistent/never", std::chrono::seconds(1));
  EXPECT_FALSE(reply.ok());
  EXPECT_NE(reply.message().find("no worker's stacks"), std::string::npos);
  EXPECT_FALSE(fs::exists("/nonexistent/never"));
}

TEST(StackReport, AnUnwritableDirectoryIsNotOk) {
  CannedHost host;
  ProcessStacks s;
  s.pid = 7;
  s.threads.push_back({7, "keel-worker", {"f+0x1 (keel-worker)"}, ""});
  host.stacks[0] = to_message(0, s);
  const control::StacksReply reply =
      collect_stacks(host, "/proc/self/keel-stacks", std::chrono::seconds(1));
  EXPECT_FALSE(reply.ok());
  EXPECT_NE(reply.message().find("cannot create /proc/self/keel-stacks"), std::string::npos)
      << reply.message();
}

TEST(StackReport, MessagesRoundTrip) {
  ProcessStacks s;
  s.pid = 42;
  s.threads.push_back({42, "keel-worker", {"a+0x1 (m)", "main+0x2 (m)"}, ""});
  s.threads.push_back({43, "helper", {}, "did not stop within the timeout (state D)"});
  const control::RankStacks m = to_message(5, s);
  EXPECT_EQ(m.rank(), 5);
  const ProcessStacks back = from_message(m);
  EXPECT_EQ(format_stacks(back), format_stacks(s));
  const RankThreads t = to_rank_threads(m);
  EXPECT_EQ(t.rank, 5);
  ASSERT_EQ(t.threads.size(), 2u);
  EXPECT_TRUE(t.threads[0].main);
  EXPECT_FALSE(t.threads[1].main);
  EXPECT_EQ(t.threads[0].frames, s.threads[0].frames);
}

}  // namespace
}  // namespace keel
