// A rank of another layout loaded from the in-memory copies of a job's ranks
// (ckpt/memory_reshard.h): real BackupServers hold the old ranks' copies (some only at a
// second server), and every rank of the new layout gets exactly the state that layout holds,
// reading only byte ranges; a copy nobody holds is named.
#include "ckpt/memory_reshard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "ckpt/backup_service.h"
#include "ckpt/checksum.h"
#include "ckpt/snapshot_region.h"
#include "runtime/backend.h"
#include "tests/ckpt/reshard_toy.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using namespace test::toy;

constexpr int64_t kStep = 40;

// One holder per old rank; rank r's copy pushed to holder r (and rank 0's also to holder 1:
// a second place to find it).
struct OldJob {
  std::string job = "memreshard" + std::to_string(::getpid());
  std::vector<std::unique_ptr<BackupServer>> holders;
  explicit OldJob(const ShardedLayout& from) {
    for (int r = 0; r < from.world(); ++r)
      holders.push_back(std::make_unique<BackupServer>(job, 100 + r));
    for (int r = 0; r < from.world(); ++r) {
      std::string payload;
      for (const auto& span : state_of(from, r))
        payload.append(reinterpret_cast<const char*>(span.data()), span.size() * sizeof(float));
      const uint64_t fp = rank_state_shape(from, r).fingerprint;
      BackupClient(holders[size_t(r)]->address(), 5s)
          .push_raw(r, kStep, fp, payload.data(), payload.size(),
                    checksum(payload.data(), payload.size()));
    }
  }
  ~OldJob() {
    holders.clear();
    unlink_job_segments(job);
  }
};

TEST(MemoryReshard, EveryRankOfAnotherLayoutGetsItsStateFromThePeersCopies) {
  auto backend = make_cpu_backend(1);
  const ShardedLayout from = layout(2, 2, 1, false);
  OldJob old(from);
  // Rank 0's only copy sits at holder 0; the first source named for it lacks it.
  const CopySources where = [&](int r) {
    std::vector<BackupSource> s;
    if (r == 0) s.push_back({old.holders[1]->address(), 101});
    s.push_back({old.holders[size_t(r)]->address(), 100 + r});
    return s;
  };
  for (auto [tp, pp, dp, z] : {std::tuple{1, 1, 1, false}, {2, 1, 2, true}, {1, 2, 2, false}}) {
    const ShardedLayout to = layout(tp, pp, dp, z);
    for (int r = 0; r < to.world(); ++r) {
      SCOPED_TRACE(testing::Message() << "(" << tp << "," << pp << "," << dp << ") rank " << r);
      const Coord c = to.topology().coord(r);
      TrainState state(backend.get(), to.table(c), c.tp, to.tp, to.dp, to.zero1);
      load_state_from_memory(from, to, r, kStep, where, state, 5s);
      EXPECT_EQ(state.step(), kStep);
      const auto want = state_of(to, r);
      std::vector<StateSpan> spans = state.spans();
      for (int k = 0; k < 3; ++k) {
        const float* got = static_cast<const float*>(spans[size_t(k)].data);
        EXPECT_EQ(std::vector<float>(got, got + spans[size_t(k)].floats), want[size_t(k)])
            << "span " << k;
      }
    }
  }
}

TEST(MemoryReshard, ACopyNobodyHoldsIsNamed) {
  auto backend = make_cpu_backend(1);
  const ShardedLayout from = layout(2, 1, 1, false);
  OldJob old(from);
  const ShardedLayout to = layout(1, 1, 1, false);
  TrainState state(backend.get(), to.table({0, 0, 0}), 0, 1, 1, false);
  // Rank 1's copy asked of rank 0's holder only.
  const CopySources where = [&](int) {
    return std::vector<BackupSource>{{old.holders[0]->address(), 100}};
  };
  try {
    load_state_from_memory(from, to, 0, kStep, where, state, 5s);
    ADD_FAILURE() << "loaded without rank 1's copy";
  } catch (const RestoreError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("of rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 100 at"), std::string::npos) << m;
  }
  // A step nobody holds.
  const CopySources both = [&](int r) {
    return std::vector<BackupSource>{{old.holders[size_t(r)]->address(), 100 + r}};
  };
  EXPECT_THROW(load_state_from_memory(from, to, 0, kStep + 1, both, state, 5s), RestoreError);
}

}  // namespace
}  // namespace keel
