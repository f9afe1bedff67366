// Refusals on the TCP planes become events (launcher/controller/tcp_refusals.h): one per
// process and second at most, carrying what rose meanwhile.
#include "launcher/controller/tcp_refusals.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

using namespace std::chrono_literals;

TEST(TcpRefusals, ARiseIsOneEventASecondPerProcessAndNothingIsLost) {
  TcpRefusals r;
  const auto t0 = TcpRefusals::Clock::now();
  EXPECT_FALSE(r.report(10, "rank 0", 0, t0));
  auto e = r.report(10, "rank 0", 3, t0);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->count, 3);
  EXPECT_EQ(e->at, "rank 0");
  // A flood within the second: held, then counted whole in the next event.
  EXPECT_FALSE(r.report(10, "rank 0", 50, t0 + 200ms));
  EXPECT_FALSE(r.report(10, "rank 0", 90, t0 + 900ms));
  // Another process is its own.
  ASSERT_TRUE(r.report(11, "rank 1", 1, t0 + 900ms));
  e = r.report(10, "rank 0", 90, t0 + 1100ms);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->count, 87);
  // No rise, no event.
  EXPECT_FALSE(r.report(10, "rank 0", 90, t0 + 5s));
}

}  // namespace
}  // namespace keel
