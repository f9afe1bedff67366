// A rendezvous can be aborted, not only timed out: when the job moves to another epoch while
// a group is still being built (a peer died before joining), the members already waiting
// leave at once with CommAborted instead of sitting out the communicator timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "parallel/hash_store.h"
#include "parallel/socket_communicator.h"
#include "test_expect.h"

namespace keel {
namespace {

using namespace std::chrono_literals;

void expect_aborted_quickly(int rank) {
  auto store = std::make_shared<HashStore>();
  std::atomic<bool> cancel{false};
  SocketCommOptions o;
  o.name = "0/cancel-test";
  o.rank = rank;  // rank 0 waits to connect to rank 1; rank 1 waits to accept rank 0
  o.size = 2;
  // Only the cancel can end the rendezvous before the deadline of expect_returns; a timeout
  // would also say so by its type (CommTimeout, not CommAborted).
  o.timeout = std::chrono::hours(2);
  o.cancel = &cancel;
  std::thread canceller([&] {
    // Cancel once the rank is inside the rendezvous: it has published its own address and
    // waits for its peer, which never comes. A cancel before that would test another path.
    try {
      store->get(o.name + "/addr/" + std::to_string(rank), 60s);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << " never published its address: " << e.what();
    }
    cancel = true;
  });
  test::expect_returns(
      [&] { EXPECT_THROW(make_socket_communicator(store, o), CommAborted) << "rank " << rank; },
      "a cancelled rendezvous");
  canceller.join();
}

TEST(RendezvousCancel, WaitingForAnAddressEndsOnCancel) {
  expect_aborted_quickly(0);
}

TEST(RendezvousCancel, WaitingToAcceptEndsOnCancel) {
  expect_aborted_quickly(1);
}

}  // namespace
}  // namespace keel
