// Hang faults over a real 2-rank socket communicator. hang: the hung rank blocks in its
// step's first collective, abort() included, while its peer gets CommTimeout within its
// timeout. hang_in_collective: the collective completes for the peer, which moves on and
// times out in the next one, while the held rank never returns and its call tracing shows it
// still inside the collective its peer finished.
#include "robust/faulty_communicator.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include "parallel/socket_communicator.h"
#include "parallel/tcp_store.h"
#include "parallel/traced_communicator.h"
#include "robust/fault_injector.h"
#include "robust/fault_spec.h"
#include "tests/parallel/rank_procs.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using test::RankProcs;

// Waits until cond() holds or `limit` passes; returns whether it held.
template <typename F>
bool eventually(F&& cond, std::chrono::milliseconds limit = 20s) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

constexpr std::chrono::milliseconds kForever = std::chrono::hours(2);
constexpr const char* kPeerTimedOut = "test/peer_timed_out";
constexpr const char* kAborted = "test/aborted";

// The supervisor's abort on the hung rank, from a thread of its own, once the peer has
// timed out (the peer says so in the store): it must not wake or free the hung rank. Says
// in the store when it is done.
void abort_once_peer_timed_out(int store_port, ProcessGroups& groups) {
  std::thread([store_port, &groups] {
    TcpStore store("127.0.0.1", store_port, 20s);
    store.get(kPeerTimedOut, kForever);
    groups.abort_all();
    store.set(kAborted, "1");
  }).detach();
}

TEST(FaultyCommunicator, ForwardsUntilArmed) {
  TcpStoreServer server;
  RankProcs procs(2, [&](int rank) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 20s);
    auto hang = std::make_shared<HangSwitch>();
    FaultyCommunicator comm(
        make_socket_communicator(store, {.name = "0/fwd", .rank = rank, .size = 2, .timeout = 20s}),
        hang);
    if (comm.rank() != rank || comm.size() != 2 || comm.name() != "0/fwd") return test::kWrong;
    float x[3] = {float(rank), 1, 2};
    comm.all_reduce(x, 3, ReduceOp::kSum);
    if (x[0] != 1 || x[1] != 2 || x[2] != 4) return test::kWrong;
    comm.barrier();
    if (comm.stats().bytes_sent == 0 || comm.aborted()) return test::kWrong;
    comm.abort();
    return comm.aborted() ? test::kOk : test::kWrong;
  });
  EXPECT_EQ(procs.wait(0), test::kOk);
  EXPECT_EQ(procs.wait(1), test::kOk);
}

TEST(FaultyCommunicator, HangBlocksTheRankAndTimesOutItsPeer) {
  TcpStoreServer server;
  FaultPlan plan;
  add_fault_flag(&plan, "hang@step=3,rank=0");
  RankProcs procs(2, [&](int rank) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 20s);
    ProcessGroups groups;
    // Every timeout but the peer's 1 s one at the hung step is hours long: only that one can
    // end the peer within the test's deadline.
    groups.world = make_socket_communicator(
        store, {.name = "0/world", .rank = rank, .size = 2, .timeout = kForever});
    FaultInjector inj(plan.schedule, rank, store);
    inj.wrap(groups);
    try {
      for (int64_t step = 0; step < 5; ++step) {
        inj.before_step(step);
        if (rank == 0 && step == 3) abort_once_peer_timed_out(server.port(), groups);
        float loss = 1;
        groups.world->all_reduce(&loss, 1, ReduceOp::kSum,
                                 rank == 1 && step == 3 ? 1000ms : kForever);
        if (loss != 2) return test::kWrong;
      }
    } catch (const CommTimeout&) {
      store->set(kPeerTimedOut, "1");
      throw;
    }
    return test::kOk;
  });
  EXPECT_EQ(procs.wait(1, 60s), test::kExitTimeout);
  // The hung rank is still blocked after its abort, until the test kills it.
  TcpStore observer("127.0.0.1", server.port(), 20s);
  EXPECT_EQ(observer.get(kAborted, 60s), "1");
  EXPECT_EQ(procs.wait(0, 2500ms), test::kExitNotFinished);

  TcpStore store("127.0.0.1", server.port(), 20s);
  auto records = FaultInjector::read_injections(store);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, "hang");
  EXPECT_EQ(records[0].rank, 0);
  EXPECT_EQ(records[0].step, 3);
}

// What the held rank's tracing says, copied by a thread of the child (as its progress
// reporter would send it) into memory the test reads.
struct Seen {
  std::atomic<int64_t> entered{-1}, finished{-1}, since_ms{0};
  std::atomic<int> in_call{-1}, peer_step2_ok{0};
};

TEST(FaultyCommunicator, HangInCollectiveCompletesItAndStaysInside) {
  void* mem =
      ::mmap(nullptr, sizeof(Seen), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED) << std::strerror(errno);
  Seen* seen = new (mem) Seen;
  TcpStoreServer server;
  FaultPlan plan;
  add_fault_flag(&plan, "hang_in_collective@step=2,rank=0");
  RankProcs procs(2, [&](int rank) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 20s);
    ProcessGroups groups;
    groups.world = make_socket_communicator(
        store, {.name = "0/world", .rank = rank, .size = 2, .timeout = kForever});
    groups.tp = make_socket_communicator(
        store, {.name = "0/tp", .rank = rank, .size = 2, .timeout = kForever});
    auto activity = std::make_shared<CommActivity>();
    trace_communicators(groups, activity);
    FaultInjector inj(plan.schedule, rank, store);
    inj.wrap(groups, activity);
    if (rank == 0) {
      std::thread([seen, activity] {
        for (;;) {
          GroupSeq tp = activity->groups()[size_t(CommGroup::kTp)];
          seen->entered = tp.entered;
          seen->finished = tp.finished;
          seen->since_ms = int64_t(tp.since * 1000);
          seen->in_call = activity->in_call() ? 1 : 0;
          std::this_thread::sleep_for(5ms);
        }
      }).detach();
    }
    try {
      for (int64_t step = 0; step < 5; ++step) {
        inj.before_step(step);
        if (rank == 0 && step == 2) abort_once_peer_timed_out(server.port(), groups);
        // Two tp collectives a step; a point-to-point exchange first, which is not held.
        float token = float(rank);
        groups.tp->send_recv(&token, 4, 1 - rank, &token, 4, 1 - rank, 1);
        if (token != float(1 - rank)) return test::kWrong;
        for (int c = 0; c < 2; ++c) {
          float x = float(rank + 1);
          groups.tp->all_reduce(&x, 1, ReduceOp::kSum, rank == 1 && step >= 2 ? 1000ms : kForever);
          if (x != 3) return test::kWrong;
          if (rank == 1 && step == 2 && c == 0) seen->peer_step2_ok = 1;
        }
      }
    } catch (const CommTimeout&) {
      store->set(kPeerTimedOut, "1");
      throw;
    }
    return test::kOk;
  });
  // The peer got the held collective's result, then timed out in the next one (the only
  // timeout short enough to end it before the deadline).
  EXPECT_EQ(procs.wait(1, 60s), test::kExitTimeout);
  EXPECT_EQ(seen->peer_step2_ok.load(), 1);
  // Steps 0 and 1 made tp collectives #1-#4; step 2's first, #5, is held: inside, not
  // finished, since it began.
  EXPECT_TRUE(eventually([&] { return seen->entered.load() == 5; }))
      << "entered " << seen->entered.load();
  EXPECT_EQ(seen->finished.load(), 4);
  EXPECT_EQ(seen->in_call.load(), 1);
  EXPECT_GT(seen->since_ms.load(), 0);
  // Still held after its abort, until the test kills it.
  TcpStore observer("127.0.0.1", server.port(), 20s);
  EXPECT_EQ(observer.get(kAborted, 60s), "1");
  EXPECT_EQ(procs.wait(0, 2500ms), test::kExitNotFinished);
  EXPECT_EQ(seen->entered.load(), 5);

  TcpStore store("127.0.0.1", server.port(), 20s);
  auto records = FaultInjector::read_injections(store);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, "hang_in_collective");
  EXPECT_EQ(records[0].rank, 0);
  EXPECT_EQ(records[0].step, 2);
  ::munmap(mem, sizeof(Seen));
}

}  // namespace
}  // namespace keel
