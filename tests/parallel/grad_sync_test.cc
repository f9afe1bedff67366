// Data-parallel gradient reduction: bucket layout, sums in both modes, and that a bucket's
// all-reduce starts as soon as its last gradient is marked ready, before finish().
#include "parallel/grad_sync.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "parallel/hash_store.h"
#include "parallel/socket_communicator.h"

namespace keel {
namespace {

using namespace std::chrono_literals;

// Two ranks as threads of this process, each with its own socket communicator.
template <typename Fn>
void run_two_ranks(const std::string& name, Fn fn) {
  auto store = std::make_shared<HashStore>();
  std::exception_ptr errors[2];
  std::thread threads[2];
  for (int r = 0; r < 2; ++r)
    threads[r] = std::thread([&, r] {
      try {
        auto comm =
            make_socket_communicator(store, {.name = name, .rank = r, .size = 2, .timeout = 20s});
        fn(r, *comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Four parameters of 100 floats at 16-float-aligned offsets; the second is deferred.
std::vector<GradSegment> segments() {
  return {{0, 100, false}, {112, 100, true}, {224, 100, false}, {336, 100, false}};
}
constexpr size_t kPadded = 448;

TEST(GradSync, BucketsNeverSpanDeferredParameters) {
  run_two_ranks("0/buckets", [](int, Communicator& comm) {
    std::vector<float> g(kPadded, 0.0f);
    // 150 floats per bucket: params 3 and 2 fill one bucket; param 0 is alone (param 1
    // between them is deferred).
    GradSync sync(&comm, g.data(), kPadded, segments(), 150 * sizeof(float), false);
    EXPECT_EQ(sync.num_buckets(), 2);
  });
}

TEST(GradSync, PlainAndZeroOneSumOverReplicas) {
  for (bool zero1 : {false, true}) {
    run_two_ranks(zero1 ? "0/sum_z" : "0/sum", [zero1](int rank, Communicator& comm) {
      std::vector<float> g(kPadded);
      for (size_t i = 0; i < kPadded; ++i) g[i] = float(i) + 1000.0f * float(rank);
      GradSync sync(&comm, g.data(), kPadded, segments(), 64, zero1);
      sync.arm();
      for (int p = 3; p >= 0; --p) sync.mark_ready(p);
      sync.finish();
      size_t lo = zero1 ? sync.shard_begin() : 0, hi = zero1 ? lo + sync.shard_numel() : kPadded;
      // Every parameter element of this rank's range is the sum; alignment gaps between
      // parameters hold zeros in a real ParamStore and are not checked.
      for (const GradSegment& s : segments())
        for (size_t i = std::max(lo, s.offset); i < std::min(hi, s.offset + s.numel); ++i)
          ASSERT_EQ(g[i], 2.0f * float(i) + 1000.0f) << i;
      if (zero1) {
        EXPECT_EQ(sync.shard_numel(), kPadded / 2);
        std::vector<float> params(kPadded, 0.0f);
        for (size_t i = lo; i < hi; ++i) params[i] = float(rank + 1);
        sync.all_gather_params(params.data());
        EXPECT_EQ(params[0], 1.0f);
        EXPECT_EQ(params[kPadded - 1], 2.0f);
      }
    });
  }
}

TEST(GradSync, ReadyBucketReducesBeforeFinish) {
  run_two_ranks("0/overlap", [](int, Communicator& comm) {
    std::vector<float> g(kPadded, 1.0f);
    GradSync sync(&comm, g.data(), kPadded, segments(), 100 * sizeof(float), false);
    sync.arm();
    sync.mark_ready(3);  // the last parameter: its own bucket, reduced in the background
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (reinterpret_cast<volatile float&>(g[336]) != 2.0f &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    EXPECT_EQ(reinterpret_cast<volatile float&>(g[336]), 2.0f)
        << "the ready bucket was not reduced before finish()";
    EXPECT_EQ(g[0], 1.0f);  // not ready, not touched yet
    for (int p = 2; p >= 0; --p) sync.mark_ready(p);
    sync.finish();
    EXPECT_EQ(g[0], 2.0f);
    EXPECT_EQ(g[112], 2.0f);  // the deferred parameter, reduced in finish()
  });
}

}  // namespace
}  // namespace keel
