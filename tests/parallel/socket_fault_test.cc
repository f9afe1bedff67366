// The failures the socket communicator must turn into typed errors instead of hangs: a peer
// killed mid-collective, a stopped peer, abort() from another thread, and a stale address
// that leads to another epoch's group.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "parallel/socket_communicator.h"
#include "parallel/tcp_store.h"
#include "tests/parallel/rank_procs.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using test::exit_code_of_current_exception;
using test::kExitAborted;
using test::kExitCommError;
using test::kExitPeerFailure;
using test::kExitTimeout;
using test::kOk;
using test::kWrong;
using test::RankProcs;

std::unique_ptr<Communicator> join(int store_port, const std::string& name, int rank, int size,
                                   Millis timeout) {
  auto store = std::make_shared<TcpStore>("127.0.0.1", store_port, 20s);
  return make_socket_communicator(store,
                                  {.name = name, .rank = rank, .size = size, .timeout = timeout});
}

// Loops all-reduces until one throws. Like a worker, a rank that catches a CommError
// aborts its communicator (closing its sockets, so its peers learn at once) and reports the
// error's kind; the second call checks the communicator stays broken.
// Collectives this process completed (a child's own copy): the main thread is busy.
std::atomic<int> g_reduces{0};

int all_reduce_until_error(Communicator& comm, Millis timeout) {
  std::vector<float> buf(1 << 18, 1.0f);
  for (int i = 0; i < 100000; ++i, ++g_reduces) {
    try {
      comm.all_reduce(buf.data(), buf.size(), ReduceOp::kSum, timeout);
    } catch (const CommError&) {
      int code = exit_code_of_current_exception();
      try {
        comm.all_reduce(buf.data(), buf.size());
        return kWrong;
      } catch (const CommError&) {
        if (exit_code_of_current_exception() != code) return kWrong;
      }
      comm.abort();
      return code;
    }
  }
  return kWrong;
}

// Ends the calling process with `sig` from another thread once the main thread is busy: it
// has completed a collective with its peers and goes on with the next ones.
void raise_soon(int sig) {
  std::thread([sig] {
    const auto end = std::chrono::steady_clock::now() + 30s;
    while (g_reduces.load() < 1 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(1ms);
    ::raise(sig);
  }).detach();
}

TEST(SocketFault, KilledPeerGivesPeerFailureNotATimeout) {
  TcpStoreServer server;
  RankProcs procs(3, [&](int rank) {
    auto comm = join(server.port(), "0/kill", rank, 3, 20s);
    if (rank == 2) raise_soon(SIGKILL);
    return all_reduce_until_error(*comm, 20s);
  });
  EXPECT_EQ(procs.wait(2), 128 + SIGKILL);
  // Within the 20 s timeout, or these would read kExitTimeout.
  EXPECT_EQ(procs.wait(0), kExitPeerFailure);
  EXPECT_EQ(procs.wait(1), kExitPeerFailure);
}

TEST(SocketFault, StoppedPeerGivesCommTimeout) {
  TcpStoreServer server;
  RankProcs procs(2, [&](int rank) {
    auto comm = join(server.port(), "0/stop", rank, 2, 20s);
    if (rank == 1) raise_soon(SIGSTOP);
    return all_reduce_until_error(*comm, 500ms);
  });
  EXPECT_EQ(procs.wait(0), kExitTimeout);
  procs.kill(1, SIGKILL);  // a stopped process still dies of SIGKILL
  EXPECT_EQ(procs.wait(1), 128 + SIGKILL);
}

TEST(SocketFault, AbortFromAnotherThreadUnblocksRecv) {
  TcpStoreServer server;
  RankProcs procs(2, [&](int rank) {
    auto comm = join(server.port(), "0/abort", rank, 2, 20s);
    std::vector<char> buf(64);
    if (rank == 1) {
      // Nobody sends: this ends when rank 0's abort closes its side.
      comm->recv(buf.data(), buf.size(), 0, 1);
      return kWrong;
    }
    // Abort once the main thread is blocked in its recv (nothing else on it sleeps in a
    // system call here); an abort before the recv would test another path.
    const pid_t main_tid = test::this_thread_id();
    std::atomic<bool> was_blocked{false};
    std::thread aborter([&] {
      was_blocked = test::wait_until_blocked(main_tid);
      comm->abort();
    });
    int code = kWrong;
    try {
      comm->recv(buf.data(), buf.size(), 1, 1);
    } catch (const CommError&) {
      code = exit_code_of_current_exception();
    }
    aborter.join();
    if (!was_blocked || !comm->aborted()) return kWrong;
    comm->abort();  // idempotent
    try {
      comm->barrier();
      return kWrong;
    } catch (const CommAborted&) {
    }
    return code;
  });
  // CommAborted well before the 20 s timeout, and the peer hears of it as a failure.
  EXPECT_EQ(procs.wait(0), kExitAborted);
  EXPECT_EQ(procs.wait(1), kExitPeerFailure);
}

// A stale address can lead a rank of epoch 1 to a listener of epoch 0. The handshake must
// refuse it, so each side fails instead of exchanging data with the wrong group.
TEST(SocketFault, OtherEpochNeverConnects) {
  TcpStoreServer server;
  TcpStore store("127.0.0.1", server.port());
  RankProcs procs(2, [&](int rank) {
    // Rank 1 of "0/g" accepts; rank 0 of "1/g" connects to the address copied below.
    const char* name = rank == 0 ? "1/g" : "0/g";
    join(server.port(), name, rank, 2, rank == 0 ? 20s : 2s);
    return kWrong;
  });
  store.set("1/g/addr/1", store.get("0/g/addr/1", 20s));
  EXPECT_EQ(procs.wait(0), kExitCommError);  // refused: not a timeout, not a dead peer
  EXPECT_EQ(procs.wait(1), kExitTimeout);    // still waiting for its own rank 0
}

}  // namespace
}  // namespace keel
