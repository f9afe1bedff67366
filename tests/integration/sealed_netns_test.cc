// Between two machines (network namespaces on veth pairs, as tests/integration/netns.h makes
// them) keel's default seals what its connections carry, and on one machine it does not: the
// decision both ends make (parallel/sealed_channel.h) on real addresses, and a backup pushed
// and fetched across.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "ckpt/backup_service.h"
#include "ckpt/checksum.h"
#include "ckpt/restore.h"
#include "ckpt/snapshot_region.h"
#include "integration/netns.h"
#include "parallel/sealed_channel.h"
#include "parallel/socket_util.h"
#include "tests/parallel/wire_tap.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using detail::Clock;
using detail::Fd;

TEST(SealedNetns, TwoMachinesSealByDefaultOneMachineDoesNot) {
  std::string why;
  if (!test::NetnsLab::available(&why)) GTEST_SKIP() << why;
  test::NetnsLab lab(2);
  ASSERT_EQ(seal_policy(), SealPolicy::kBetweenMachines);

  // A connection from machine 1 to machine 0, and one inside machine 0 to its own address.
  Fd listener, across_client, across_server, local_client, local_server;
  lab.run_in(0, [&] { listener = detail::listen_tcp(lab.address(0), 0, 4); });
  const int port = detail::local_port(listener.get());
  auto accept_one = [&] {
    const auto deadline = Clock::now() + 5s;
    while (Clock::now() < deadline) {
      const int s = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (s >= 0) return Fd(s);
      std::this_thread::sleep_for(1ms);
    }
    return Fd();
  };
  lab.run_in(1, [&] {
    across_client = detail::connect_tcp(lab.address(0), port, Clock::now() + 5s, "machine 0");
  });
  across_server = accept_one();
  lab.run_in(0, [&] {
    local_client = detail::connect_tcp(lab.address(0), port, Clock::now() + 5s, "machine 0");
  });
  local_server = accept_one();
  ASSERT_TRUE(across_server.valid() && local_server.valid());
  EXPECT_FALSE(same_machine(across_client.get()));
  EXPECT_FALSE(same_machine(across_server.get()));
  EXPECT_TRUE(seals(across_client.get()) && seals(across_server.get()));
  EXPECT_TRUE(same_machine(local_client.get()));
  EXPECT_TRUE(same_machine(local_server.get()));
  EXPECT_FALSE(seals(local_client.get()) || seals(local_server.get()));

  // A backup across: pushed from machine 1 to a holder on machine 0 and fetched back whole.
  const std::string job = "sealnetns" + std::to_string(::getpid());
  std::unique_ptr<BackupServer> server;
  lab.run_in(0, [&] {
    BackupServerOptions o;
    o.host = lab.address(0);
    server = std::make_unique<BackupServer>(job, 1, o);
  });
  const std::string payload = test::pattern(3 << 20);
  lab.run_in(1, [&] {
    BackupClient(server->address(), 5s)
        .push_raw(0, 9, 0x77, payload.data(), payload.size(),
                  checksum(payload.data(), payload.size()));
  });
  EXPECT_EQ(server->pushes_committed(), 1);
  EXPECT_EQ(held_steps(job, 0, 1, false), std::vector<int64_t>{9});
  std::string back(64, '\0');
  lab.run_in(1, [&] {
    std::string why_not;
    EXPECT_TRUE(BackupClient(server->address(), 5s)
                    .fetch_range(0, 9, 0x77, 1000, back.size(), back.data(), &why_not))
        << why_not;
  });
  EXPECT_EQ(back, payload.substr(1000, 64));
  server.reset();
  unlink_job_segments(job);
}

}  // namespace
}  // namespace keel
