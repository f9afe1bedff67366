// probe_port: what the controller asks a slot's host when the slot's agent's connection
// closes (launcher/controller/agent_host_liveness.cc): a port whose process lives answers, one
// whose process was killed is refused by its kernel at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "parallel/socket_util.h"

namespace keel::detail {
namespace {

using namespace std::chrono_literals;

TEST(PortProbe, ALiveListenerAnswersAndAKilledOnesPortIsRefused) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Fd l = listen_tcp("127.0.0.1", 0, 4);
    const int port = local_port(l.get());
    if (::write(ready[1], &port, sizeof port) != sizeof port) _exit(1);
    while (true) ::pause();
  }
  int port = 0;
  ASSERT_EQ(::read(ready[0], &port, sizeof port), ssize_t(sizeof port));
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_EQ(probe_port("127.0.0.1", port, Clock::now() + 1s), PortProbe::kListening);
  ASSERT_EQ(::kill(child, SIGKILL), 0);  // the process dies, its kernel closes the socket
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  // Refused, not silent: the kernel answers for the dead process.
  EXPECT_EQ(probe_port("127.0.0.1", port, Clock::now() + 1s), PortProbe::kRefused);
  EXPECT_TRUE(connection_refused("127.0.0.1", port, Clock::now() + 1s));
}

}  // namespace
}  // namespace keel::detail
