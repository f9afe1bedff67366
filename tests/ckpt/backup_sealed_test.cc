// Backups between machines are sealed (parallel/sealed_channel.h): pushed through an
// intruder's relay, a snapshot never shows on the wire, and one altered on the way is not
// taken.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <string>
#include <thread>
#include <vector>

#include "ckpt/backup_service.h"
#include "ckpt/checksum.h"
#include "ckpt/restore.h"
#include "ckpt/snapshot_region.h"
#include "parallel/peer_auth.h"
#include "parallel/sealed_channel.h"
#include "parallel/socket_util.h"
#include "tests/parallel/wire_tap.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using detail::Clock;
using detail::Fd;
using detail::IoResult;

using test::drain;
using test::pattern;

// A backup pushed through an intruder's relay that alters one byte of the payload: the holder
// refuses the connection and keeps what it held; the snapshot never shows on the wire.
TEST(BackupServiceSealed, ABackupAlteredOnTheWayIsNotTakenAndNeverReadable) {
  set_seal_policy(SealPolicy::kAlways);
  const std::string job = "sealtest" + std::to_string(::getpid());
  BackupServerOptions so;
  BackupServer server(job, 1, so);
  // The intruder: forwards both ways, flipping one byte once `flip_after` bytes from the
  // client have passed (0: none), and records what the client sent.
  Fd relay_listen = detail::listen_tcp("127.0.0.1", 0, 4);
  const int relay_port = detail::local_port(relay_listen.get());
  auto run_relay = [&](size_t flip_after, std::string* seen) {
    return std::thread([&, flip_after, seen] {
      int c = -1;
      const auto deadline = Clock::now() + 10s;
      while (c < 0 && Clock::now() < deadline) {
        c = ::accept4(relay_listen.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0) std::this_thread::sleep_for(1ms);
      }
      Fd in(c);
      Fd out = detail::connect_tcp("127.0.0.1", server.port(), Clock::now() + 5s, "server");
      size_t passed = 0;
      bool flipped = false;
      while (Clock::now() < deadline) {
        std::string up = drain(in.get()), down = drain(out.get());
        if (!flipped && flip_after && passed + up.size() > flip_after) {
          up[flip_after - passed] ^= 0x10;
          flipped = true;
        }
        passed += up.size();
        *seen += up;
        std::string err;
        if (!up.empty() && detail::send_all(out.get(), up.data(), up.size(), Clock::now() + 5s,
                                            &err) != IoResult::kOk)
          return;
        if (!down.empty() && detail::send_all(in.get(), down.data(), down.size(), Clock::now() + 5s,
                                              &err) != IoResult::kOk)
          return;
        char probe;
        if (::recv(in.get(), &probe, 1, MSG_DONTWAIT | MSG_PEEK) == 0) return;
        if (::recv(out.get(), &probe, 1, MSG_DONTWAIT | MSG_PEEK) == 0) return;
        if (up.empty() && down.empty()) std::this_thread::sleep_for(1ms);
      }
    });
  };
  const std::string payload = pattern(3 << 20);
  const std::string addr = "127.0.0.1:" + std::to_string(relay_port);
  {
    std::string seen;
    std::thread relay = run_relay(0, &seen);
    BackupClient(addr, 5s).push_raw(0, 5, 0x1234, payload.data(), payload.size(),
                                    checksum(payload.data(), payload.size()));
    relay.join();
    EXPECT_EQ(server.pushes_committed(), 1);
    EXPECT_EQ(seen.find(pattern(40)), std::string::npos) << "the snapshot was readable";
  }
  {
    std::string seen;
    std::thread relay = run_relay(2 << 20, &seen);
    const int64_t refused = auth_refusals();
    EXPECT_THROW(BackupClient(addr, 5s).push_raw(0, 6, 0x1234, payload.data(), payload.size(),
                                                 checksum(payload.data(), payload.size())),
                 BackupError);
    relay.join();
    EXPECT_EQ(server.pushes_committed(), 1) << "an altered push was taken";
    EXPECT_EQ(auth_refusals(), refused + 1);
  }
  EXPECT_EQ(held_steps(job, 0, 1, false), std::vector<int64_t>{5});
  server.stop();
  unlink_job_segments(job);
  set_seal_policy(SealPolicy::kBetweenMachines);
}

}  // namespace
}  // namespace keel
