// The socket communicator with real processes on loopback: collectives against serial
// references, bitwise agreement across ranks and runs, point-to-point framing, and the
// size-1 group. Faults (death, stop, abort, stale epochs) are in socket_fault_test.cc.
#include "parallel/socket_communicator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "parallel/sealed_channel.h"
#include "parallel/tcp_store.h"
#include "tests/parallel/rank_procs.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using test::kOk;
using test::kWrong;
using test::RankProcs;

std::unique_ptr<Communicator> join(int store_port, const std::string& name, int rank, int size) {
  auto store = std::make_shared<TcpStore>("127.0.0.1", store_port, 20s);
  return make_socket_communicator(store,
                                  {.name = name, .rank = rank, .size = size, .timeout = 20s});
}

// A deterministic input in [-1, 1) that differs per rank, element and salt.
float input(int rank, size_t i, uint32_t salt) {
  uint32_t x = uint32_t(rank + 1) * 0x9E3779B9u ^ uint32_t(i) * 0x85EBCA6Bu ^ salt * 0xC2B2AE35u;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return float(x >> 8) / float(1 << 23) - 1.0f;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Returns kWrong (and says why) unless cond holds; for use inside a child.
#define CHILD_EXPECT(cond, ...)                                \
  do {                                                         \
    if (!(cond)) {                                             \
      std::fprintf(stderr, "child check failed: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                       \
      std::fprintf(stderr, "\n");                              \
      return kWrong;                                           \
    }                                                          \
  } while (0)

const std::vector<size_t> kSizes = {1, 2, 3, 4, 5, 7, 8, 31, 1000, 65537};

// Each rank all-reduces every size with sum and max, checks against a serial reference and
// writes the raw result bits to dir/rank<r>.bin.
int all_reduce_rank(int port, int world, int rank, const std::string& name,
                    const std::string& dir) {
  auto comm = join(port, name, rank, world);
  std::string bits;
  for (size_t n : kSizes) {
    std::vector<float> sum(n), max(n);
    for (size_t i = 0; i < n; ++i) sum[i] = max[i] = input(rank, i, uint32_t(n));
    comm->all_reduce(sum.data(), n, ReduceOp::kSum);
    comm->all_reduce(max.data(), n, ReduceOp::kMax);
    for (size_t i = 0; i < n; ++i) {
      double ref = 0;
      float ref_max = -2;
      for (int r = 0; r < world; ++r) {
        ref += input(r, i, uint32_t(n));
        ref_max = std::max(ref_max, input(r, i, uint32_t(n)));
      }
      CHILD_EXPECT(std::fabs(sum[i] - ref) < 1e-5, "n=%zu i=%zu sum %g vs %g", n, i, sum[i], ref);
      CHILD_EXPECT(max[i] == ref_max, "n=%zu i=%zu max %g vs %g", n, i, max[i], ref_max);
    }
    bits.append(reinterpret_cast<const char*>(sum.data()), n * sizeof(float));
    bits.append(reinterpret_cast<const char*>(max.data()), n * sizeof(float));
  }
  write_file(dir + "/rank" + std::to_string(rank) + ".bin", bits);
  return kOk;
}

TEST(SocketCommunicator, AllReduceIsCorrectAndBitwiseIdenticalAcrossRanksAndRuns) {
  for (int world : {2, 3, 4}) {
    std::string first_run_bits;
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE("world " + std::to_string(world) + " run " + std::to_string(run));
      TcpStoreServer server;
      std::string dir = test::temp_dir("allreduce");
      std::string name = "0/dp.w" + std::to_string(world);
      RankProcs procs(world,
                      [&](int r) { return all_reduce_rank(server.port(), world, r, name, dir); });
      ASSERT_EQ(procs.wait_all(), std::vector<int>(world, kOk));
      std::string bits0 = read_file(dir + "/rank0.bin");
      ASSERT_FALSE(bits0.empty());
      for (int r = 1; r < world; ++r)
        EXPECT_TRUE(read_file(dir + "/rank" + std::to_string(r) + ".bin") == bits0) << "rank " << r;
      if (run == 0)
        first_run_bits = bits0;
      else
        EXPECT_TRUE(bits0 == first_run_bits) << "results differ between runs";
    }
  }
}

// Sealed connections (what crosses machines, parallel/sealed_channel.h; forced here on
// loopback) carry the same bits: all-reduces of every size and one of 4 MiB (records of 256
// KiB split its ring chunks), a broadcast and a send in each direction, sealed and plain.
TEST(SocketCommunicator, SealedConnectionsCarryTheSameBits) {
  constexpr int kWorld = 3;
  std::string bits[2];
  for (int sealed = 0; sealed < 2; ++sealed) {
    // Every process of a job holds the same policy (the ranks inherit it).
    set_seal_policy(sealed ? SealPolicy::kAlways : SealPolicy::kNever);
    TcpStoreServer server;
    const std::string dir = test::temp_dir("sealed");
    RankProcs procs(kWorld, [&](int rank) {
      if (all_reduce_rank(server.port(), kWorld, rank, "0/plain", dir) != kOk) return kWrong;
      auto comm = join(server.port(), "0/big", rank, kWorld);
      std::vector<float> big(size_t{1} << 20);
      for (size_t i = 0; i < big.size(); ++i) big[i] = input(rank, i, 7);
      comm->all_reduce(big.data(), big.size(), ReduceOp::kSum);
      std::vector<float> b(100000, float(rank));
      comm->broadcast(b.data(), b.size() * sizeof(float), 1);
      CHILD_EXPECT(b[99999] == 1.0f, "broadcast");
      std::vector<float> p2p(300000, float(rank));
      if (rank == 0) comm->send(p2p.data(), p2p.size() * sizeof(float), 2, 5);
      if (rank == 2) comm->recv(p2p.data(), p2p.size() * sizeof(float), 0, 5);
      CHILD_EXPECT(p2p[299999] == float(rank == 2 ? 0 : rank), "send/recv");
      std::string out = read_file(dir + "/rank" + std::to_string(rank) + ".bin");
      out.append(reinterpret_cast<const char*>(big.data()), big.size() * sizeof(float));
      write_file(dir + "/rank" + std::to_string(rank) + ".bin", out);
      return kOk;
    });
    const std::vector<int> codes = procs.wait_all();
    set_seal_policy(SealPolicy::kBetweenMachines);
    ASSERT_EQ(codes, std::vector<int>(kWorld, kOk));
    bits[sealed] = read_file(dir + "/rank1.bin");
  }
  EXPECT_GT(bits[0].size(), size_t{4} << 20);
  EXPECT_TRUE(bits[0] == bits[1]) << "sealed connections changed the result";
}

TEST(SocketCommunicator, ReduceScatterAndAllGather) {
  constexpr int kWorld = 3;
  constexpr size_t kChunk = 5;
  TcpStoreServer server;
  RankProcs procs(kWorld, [&](int rank) {
    auto comm = join(server.port(), "0/rs", rank, kWorld);
    // Integer-valued floats: the sum is exact whatever the order.
    std::vector<float> buf(kWorld * kChunk);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(rank * 100 + i);
    comm->reduce_scatter(buf.data(), kChunk);
    for (size_t j = 0; j < kChunk; ++j) {
      float want = float((0 + 1 + 2) * 100 + kWorld * (rank * kChunk + j));
      CHILD_EXPECT(buf[rank * kChunk + j] == want, "rank %d j %zu: %g vs %g", rank, j,
                   buf[rank * kChunk + j], want);
    }
    std::fill(buf.begin(), buf.end(), -1.0f);
    for (size_t j = 0; j < kChunk; ++j) buf[rank * kChunk + j] = float(rank * 1000 + j);
    comm->all_gather(buf.data(), kChunk);
    for (int c = 0; c < kWorld; ++c)
      for (size_t j = 0; j < kChunk; ++j)
        CHILD_EXPECT(buf[c * kChunk + j] == float(c * 1000 + j), "chunk %d j %zu", c, j);
    return kOk;
  });
  EXPECT_EQ(procs.wait_all(), std::vector<int>(kWorld, kOk));
}

TEST(SocketCommunicator, BroadcastFromEveryRoot) {
  constexpr int kWorld = 5;  // not a power of two: the tree has uneven branches
  TcpStoreServer server;
  RankProcs procs(kWorld, [&](int rank) {
    auto comm = join(server.port(), "0/bc", rank, kWorld);
    for (int root = 0; root < kWorld; ++root) {
      std::string buf(10001, '\0');
      if (rank == root)
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = char(i * 7 + root);
      comm->broadcast(buf.data(), buf.size(), root);
      for (size_t i = 0; i < buf.size(); ++i)
        CHILD_EXPECT(buf[i] == char(i * 7 + root), "root %d byte %zu", root, i);
      comm->broadcast(nullptr, 0, root);
    }
    return kOk;
  });
  EXPECT_EQ(procs.wait_all(), std::vector<int>(kWorld, kOk));
}

TEST(SocketCommunicator, TaggedSendRecvChecksTagAndSize) {
  TcpStoreServer server;
  RankProcs procs(2, [&](int rank) {
    auto comm = join(server.port(), "0/p2p", rank, 2);
    auto sized = join(server.port(), "0/p2p-size", rank, 2);
    std::vector<char> msg(100);
    for (size_t i = 0; i < msg.size(); ++i) msg[i] = char(i);
    if (rank == 0) {
      comm->send(msg.data(), msg.size(), 1, 7);
      comm->send(msg.data(), 12, 1, 8);
      sized->send(msg.data(), 50, 1, 1);
      comm->recv(msg.data(), 1, 1, 0);  // rank 1 never sends: ends when rank 1 exits
      return kWrong;
    }
    std::vector<char> got(100);
    comm->recv(got.data(), got.size(), 0, 7);
    CHILD_EXPECT(got == msg, "payload differs");
    try {
      comm->recv(got.data(), 12, 0, 9);
      CHILD_EXPECT(false, "a tag mismatch was accepted");
    } catch (const CommTimeout&) {
      CHILD_EXPECT(false, "tag mismatch read as a timeout");
    } catch (const PeerFailure&) {
      CHILD_EXPECT(false, "tag mismatch read as a peer failure");
    } catch (const CommError& e) {
      std::string what = e.what();
      CHILD_EXPECT(what.find("expected send tag 9 of 12 bytes, got send tag 8 of 12 bytes") !=
                       std::string::npos,
                   "%s", what.c_str());
    }
    // Broken now: the next call fails without touching the socket.
    try {
      comm->recv(got.data(), 12, 0, 8);
      CHILD_EXPECT(false, "a broken communicator accepted a call");
    } catch (const CommError&) {
    }
    try {
      sized->recv(got.data(), 100, 0, 1);
      CHILD_EXPECT(false, "a size mismatch was accepted");
    } catch (const CommError& e) {
      std::string what = e.what();
      CHILD_EXPECT(what.find("expected send tag 1 of 100 bytes, got send tag 1 of 50 bytes") !=
                       std::string::npos,
                   "%s", what.c_str());
    }
    return kOk;
  });
  EXPECT_EQ(procs.wait(1), kOk);
  EXPECT_EQ(procs.wait(0), test::kExitPeerFailure);
}

TEST(SocketCommunicator, SendRecvBothWaysAtOnceDoesNotDeadlock) {
  constexpr size_t kBytes = 8 << 20;  // far more than the socket buffers hold
  TcpStoreServer server;
  RankProcs procs(3, [&](int rank) {
    auto comm = join(server.port(), "0/pp", rank, 3);
    std::vector<char> out(kBytes), in(kBytes);
    for (size_t i = 0; i < kBytes; i += 4096) out[i] = char(rank * 31 + i / 4096);
    if (rank < 2) {
      int peer = 1 - rank;
      comm->send_recv(out.data(), kBytes, peer, in.data(), kBytes, peer, 5);
      for (size_t i = 0; i < kBytes; i += 4096)
        CHILD_EXPECT(in[i] == char(peer * 31 + i / 4096), "pair byte %zu", i);
    }
    // A ring shift: everyone sends right and receives from the left at once.
    int right = (rank + 1) % 3, left = (rank + 2) % 3;
    comm->send_recv(out.data(), kBytes, right, in.data(), kBytes, left, 6);
    for (size_t i = 0; i < kBytes; i += 4096)
      CHILD_EXPECT(in[i] == char(left * 31 + i / 4096), "ring byte %zu", i);
    // Half-null forms skip that half.
    if (rank == 0) comm->send_recv(out.data(), 16, 2, nullptr, 0, -1, 9);
    if (rank == 2) comm->send_recv(nullptr, 0, -1, in.data(), 16, 0, 9);
    comm->barrier();
    return kOk;
  });
  EXPECT_EQ(procs.wait_all(), std::vector<int>(3, kOk));
}

TEST(SocketCommunicator, StatsCountPayloadBytesAndTime) {
  constexpr int kWorld = 4;
  constexpr size_t kN = 4000;
  TcpStoreServer server;
  RankProcs procs(kWorld, [&](int rank) {
    auto comm = join(server.port(), "0/stats", rank, kWorld);
    std::vector<float> buf(kN, 1.0f);
    comm->barrier();
    CHILD_EXPECT(comm->stats().bytes_sent == 0, "a barrier moves no payload");
    comm->all_reduce(buf.data(), kN);
    CHILD_EXPECT(buf[0] == kWorld && buf[kN - 1] == kWorld, "sum %g", buf[0]);
    // Ring all-reduce: 2·(W-1) steps of N/W floats each way.
    const uint64_t want = 2 * (kWorld - 1) * (kN / kWorld) * sizeof(float);
    CommStats s = comm->stats();
    CHILD_EXPECT(s.bytes_sent == want && s.bytes_received == want, "sent %llu received %llu",
                 (unsigned long long)s.bytes_sent, (unsigned long long)s.bytes_received);
    CHILD_EXPECT(s.wait_s > 0, "no time accounted");
    return kOk;
  });
  EXPECT_EQ(procs.wait_all(), std::vector<int>(kWorld, kOk));
}

TEST(SocketCommunicator, SizeOneGroupNeedsNoStoreAndDoesNothing) {
  auto comm = make_socket_communicator(nullptr, {.name = "0/solo", .rank = 0, .size = 1});
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->name(), "0/solo");
  std::vector<float> buf = {1.5f, -2.0f};
  comm->all_reduce(buf.data(), buf.size(), ReduceOp::kMax);
  comm->reduce_scatter(buf.data(), 2);
  comm->all_gather(buf.data(), 2);
  comm->broadcast(buf.data(), sizeof(float) * 2, 0);
  comm->barrier();
  EXPECT_EQ(buf, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_THROW(comm->send(buf.data(), 4, 0, 0), Error);  // no peer to send to
  comm->abort();
  EXPECT_TRUE(comm->aborted());
  EXPECT_THROW(comm->barrier(), CommAborted);
}

}  // namespace
}  // namespace keel
