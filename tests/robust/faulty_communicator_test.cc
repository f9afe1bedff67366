// A hang fault over a real 2-rank socket communicator: the hung rank blocks in its step's
// first collective, abort() included, while its peer gets CommTimeout within its timeout.
#include "robust/faulty_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "parallel/socket_communicator.h"
#include "parallel/tcp_store.h"
#include "robust/fault_injector.h"
#include "robust/fault_spec.h"
#include "tests/parallel/rank_procs.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using test::RankProcs;

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
    groups.world = make_socket_communicator(
        store, {.name = "0/world", .rank = rank, .size = 2, .timeout = 20s});
    FaultInjector inj(plan.schedule, rank, store);
    inj.wrap(groups);
    for (int64_t step = 0; step < 5; ++step) {
      inj.before_step(step);
      if (rank == 0 && step == 3) {
        // The supervisor's abort, once the peer has timed out: it must not wake a hung rank.
        std::thread([&] {
          std::this_thread::sleep_for(1500ms);
          groups.abort_all();
        }).detach();
      }
      float loss = 1;
      groups.world->all_reduce(&loss, 1, ReduceOp::kSum, rank == 1 && step == 3 ? 1000ms : 20000ms);
      if (loss != 2) return test::kWrong;
    }
    return test::kOk;
  });
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(procs.wait(1), test::kExitTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  // The hung rank is still blocked, abort notwithstanding, until the test kills it.
  EXPECT_EQ(procs.wait(0, 2500ms), test::kExitNotFinished);

  TcpStore store("127.0.0.1", server.port(), 20s);
  auto records = FaultInjector::read_injections(store);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, "hang");
  EXPECT_EQ(records[0].rank, 0);
  EXPECT_EQ(records[0].step, 3);
}

}  // namespace
}  // namespace keel
