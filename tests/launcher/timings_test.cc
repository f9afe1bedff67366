// The control plane's timing table (launcher/timings.h): its own inequalities hold, and a job
// whose detect.* settings break one is told which, with both values.
#include "launcher/timings.h"

#include <gtest/gtest.h>

#include "test_expect.h"

namespace keel {
namespace {

std::string all(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

TEST(Timings, TheTableAndTheDefaultsFitTogether) {
  const config::DetectConfig defaults;
  EXPECT_TRUE(timings::check_timings(defaults, /*with_etcd=*/true).empty())
      << all(timings::check_timings(defaults, true));
  // The smallest settings the config accepts (proto/config_loader.cc) fit too.
  config::DetectConfig least;
  least.set_slot_timeout_ms(1000);
  least.set_liveness_timeout_ms(600);
  EXPECT_TRUE(timings::check_timings(least, false).empty())
      << all(timings::check_timings(least, false));
}

TEST(Timings, AControllerTimeoutShorterThanATakeoverIsRefusedWithEtcdOnly) {
  config::DetectConfig d;
  d.set_controller_timeout_ms(3000);
  const std::vector<std::string> bad = timings::check_timings(d, /*with_etcd=*/true);
  ASSERT_EQ(bad.size(), 1u) << all(bad);
  EXPECT_HAS(bad[0],
             "the leader's lease and an agent's move (6000 ms) must be below "
             "detect.controller_timeout_ms (3000 ms)");
  // Without etcd there is no successor to wait for: the timeout only stops orphaned slots.
  EXPECT_TRUE(timings::check_timings(d, /*with_etcd=*/false).empty());
}

TEST(Timings, ASlotTimeoutWithinTheHeartbeatsIsRefused) {
  config::DetectConfig d;
  d.set_slot_timeout_ms(500);
  d.set_liveness_timeout_ms(300);
  const std::string bad = all(timings::check_timings(d, false));
  EXPECT_HAS(bad, "5 heartbeats (1000 ms) must be at most detect.slot_timeout_ms (500 ms)");
  EXPECT_HAS(bad, "3 reports (600 ms) must be at most detect.liveness_timeout_ms (300 ms)");
}

}  // namespace
}  // namespace keel
