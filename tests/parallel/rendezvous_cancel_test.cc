// A rendezvous can be aborted, not only timed out: when the job moves to another epoch while
// a group is still being built (a peer died before joining), the members already waiting
// leave at once with CommAborted instead of sitting out the communicator timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "parallel/hash_store.h"
#include "parallel/socket_communicator.h"

namespace keel {
namespace {

using Clock = std::chrono::steady_clock;

void expect_aborted_quickly(int rank) {
  auto store = std::make_shared<HashStore>();
  std::atomic<bool> cancel{false};
  SocketCommOptions o;
  o.name = "0/cancel-test";
  o.rank = rank;  // rank 0 waits to connect to rank 1; rank 1 waits to accept rank 0
  o.size = 2;
  o.timeout = std::chrono::seconds(60);
  o.cancel = &cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel = true;
  });
  const auto t0 = Clock::now();
  EXPECT_THROW(make_socket_communicator(store, o), CommAborted);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  canceller.join();
  EXPECT_LT(took, 5.0) << "rank " << rank << " waited for the timeout instead";
}

TEST(RendezvousCancel, WaitingForAnAddressEndsOnCancel) {
  expect_aborted_quickly(0);
}

TEST(RendezvousCancel, WaitingToAcceptEndsOnCancel) {
  expect_aborted_quickly(1);
}

}  // namespace
}  // namespace keel
