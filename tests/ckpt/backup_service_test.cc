// Peer backups over loopback TCP: push and fetch, a holder killed with SIGKILL and its
// successor serving the same backups from shared memory, payloads corrupted in flight,
// stalled and dying peers, and fetches that must fail cleanly.
#include "ckpt/backup_service.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "ckpt/checksum.h"
#include "ckpt/snapshot_region.h"
#include "ckpt_test_util.h"
#include "parallel/peer_auth.h"
#include "parallel/socket_util.h"
#include "runtime/profiling_backend.h"
#include "test_expect.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using test::dump;
using test::fill;
using test::JobGuard;
using test::make_state;

// A BackupServer in a child process, as in a holder rank's worker; it reports its port
// through a pipe and serves until killed.
struct HolderProcess {
  pid_t pid = -1;
  int port = -1;

  HolderProcess(const std::string& job, int holder) {
    int p[2];
    EXPECT_EQ(::pipe(p), 0);
    pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      int port_or_fail = -1;
      try {
        BackupServer server(job, holder);
        port_or_fail = server.port();
        if (::write(p[1], &port_or_fail, sizeof(port_or_fail)) != sizeof(port_or_fail)) ::_exit(2);
        for (;;) ::pause();
      } catch (...) {
      }
      ::_exit(1);
    }
    ::close(p[1]);
    if (::read(p[0], &port, sizeof(port)) != sizeof(port)) port = -1;
    ::close(p[0]);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  void kill9() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
  }
  ~HolderProcess() { kill9(); }
};

class BackupServiceTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  JobGuard guard;
  std::unique_ptr<TrainState> state = make_state(backend.get());
  std::unique_ptr<SnapshotRegion> own = SnapshotRegion::open_or_create(
      snapshot_segment_name(guard.job(), 0), state->bytes(), state->layout_fingerprint(), 0);

  std::vector<char> snapshot(int64_t step) {
    fill(*state, static_cast<uint32_t>(step));
    own->write(*state, step);
    return dump(*state);
  }
};

TEST_F(BackupServiceTest, PushFetchSurvivesHolderKill) {
  auto five = snapshot(5);
  auto six = snapshot(6);
  {
    HolderProcess holder(guard.job(), 1);
    ASSERT_GT(holder.port, 0);
    BackupClient client(holder.address(), 5s);
    EXPECT_EQ(client.push(*own, 5), state->bytes());
    EXPECT_EQ(client.push(*own, 6), state->bytes());

    auto b = make_state(backend.get());
    std::string why;
    ASSERT_TRUE(client.fetch(0, 6, *b, &why)) << why;
    EXPECT_EQ(dump(*b), six);

    holder.kill9();
    // The dead holder's connection fails as a typed error, never a hang or a signal.
    EXPECT_THROW(client.fetch(0, 6, *b, &why), BackupError);
  }
  // The backups are in the holder's segment, which outlived the process.
  auto seg = SnapshotRegion::open_existing(backup_segment_name(guard.job(), 1));
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->valid_steps(0), (std::vector<int64_t>{6, 5}));

  HolderProcess successor(guard.job(), 1);
  ASSERT_GT(successor.port, 0);
  BackupClient client(successor.address(), 5s);
  auto b = make_state(backend.get());
  std::string why;
  ASSERT_TRUE(client.fetch(0, 5, *b, &why)) << why;
  EXPECT_EQ(dump(*b), five);
  ASSERT_TRUE(client.fetch(0, 6, *b, &why)) << why;
  EXPECT_EQ(dump(*b), six);
  EXPECT_FALSE(client.fetch(0, 4, *b, &why));
  EXPECT_HAS(why, "holds no backup of rank 0 at step 4 (holds steps: 6, 5)");
  EXPECT_FALSE(client.fetch(3, 6, *b, &why));  // held for rank 0, not rank 3
  EXPECT_HAS(why, "rank 3");
}

TEST_F(BackupServiceTest, PayloadCorruptedInFlightIsRefused) {
  BackupServer server(guard.job(), 1);
  BackupClient client(server.address(), 5s);
  auto good = snapshot(8);
  client.push(*own, 8);
  auto v = own->find(8);
  ASSERT_TRUE(v);
  std::vector<char> damaged(v->payload, v->payload + v->bytes);
  damaged[100] ^= 0x10;  // what a flipped bit on the wire looks like to the holder
  try {
    client.push_raw(0, 9, v->fingerprint, damaged.data(), damaged.size(), v->checksum);
    ADD_FAILURE() << "no BackupError";
  } catch (const BackupError& e) {
    EXPECT_HAS(e.what(), "checksum mismatch");
  }
  EXPECT_EQ(server.pushes_refused(), 1);
  EXPECT_EQ(server.pushes_committed(), 1);
  auto seg = SnapshotRegion::open_existing(backup_segment_name(guard.job(), 1));
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->valid_steps(), std::vector<int64_t>{8});  // step 9 never became valid

  // The same connection goes on serving.
  auto b = make_state(backend.get());
  std::string why;
  ASSERT_TRUE(client.fetch(0, 8, *b, &why)) << why;
  EXPECT_EQ(dump(*b), good);
}

// The holder sends a slot without a pass of its own over it; the client's checksum finds
// the damage, the holder confirms it and drops the slot, so no survey offers its step again.
TEST_F(BackupServiceTest, HeldSlotCorruptedIsRefusedAndDropped) {
  BackupServer server(guard.job(), 1);
  BackupClient client(server.address(), 5s);
  auto two = snapshot(2);
  client.push(*own, 2);
  snapshot(3);
  client.push(*own, 3);
  ASSERT_TRUE(corrupt_snapshot_slot(backup_segment_name(guard.job(), 1), 3, 7));
  auto b = make_state(backend.get());
  std::string why;
  EXPECT_FALSE(client.fetch(0, 3, *b, &why));
  EXPECT_HAS(why, "backup held by rank 1: slot checksum mismatch");
  auto seg = SnapshotRegion::open_existing(backup_segment_name(guard.job(), 1));
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->valid_steps(0), std::vector<int64_t>{2});
  // The connection goes on: the step is no longer held, the older one is served intact.
  EXPECT_FALSE(client.fetch(0, 3, *b, &why));
  EXPECT_HAS(why, "holds no backup of rank 0 at step 3 (holds steps: 2)");
  ASSERT_TRUE(client.fetch(0, 2, *b, &why)) << why;
  EXPECT_EQ(dump(*b), two);
}

// A holder whose payload is damaged on the way: the client's own checksum of what it
// received refuses it. The fake holder speaks the wire format of backup_service.cc.
TEST_F(BackupServiceTest, FetchDamagedInFlightIsRefused) {
  snapshot(5);
  auto v = own->find(5);
  ASSERT_TRUE(v);
  std::vector<char> damaged(v->payload, v->payload + v->bytes);
  damaged[321] ^= 0x04;
  detail::Fd listener = detail::listen_tcp("127.0.0.1", 0, 1);
  const int port = detail::local_port(listener.get());
  struct Reply {
    uint32_t magic = 0x4b425250u;
    int32_t status = 0;
    uint32_t msg_len = 0, reserved = 0;
    int64_t step = 0;
    uint64_t fingerprint = 0, bytes = 0, checksum = 0;
  };
  std::thread holder([&] {
    const auto deadline = detail::Clock::now() + 5s;
    int fd = -1;
    while (fd < 0 && detail::Clock::now() < deadline)
      fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    ASSERT_GE(fd, 0);
    detail::Fd conn(fd);
    authenticate_client(fd, {"backup", 0}, deadline, "fake holder");  // a holder of the job
    char request[48];
    std::string err;
    ASSERT_EQ(detail::recv_all(fd, request, sizeof(request), deadline, &err),
              detail::IoResult::kOk);
    Reply head;
    head.step = 5;
    head.fingerprint = v->fingerprint;
    head.bytes = v->bytes;
    head.checksum = v->checksum;
    ASSERT_EQ(detail::send_all(fd, &head, sizeof(head), deadline, &err), detail::IoResult::kOk);
    ASSERT_EQ(detail::send_all(fd, damaged.data(), damaged.size(), deadline, &err),
              detail::IoResult::kOk);
    // The client asks the holder to check its slot, which is fine.
    ASSERT_EQ(detail::recv_all(fd, request, sizeof(request), deadline, &err),
              detail::IoResult::kOk);
    Reply fine;
    ASSERT_EQ(detail::send_all(fd, &fine, sizeof(fine), deadline, &err), detail::IoResult::kOk);
    char eof;
    detail::recv_all(fd, &eof, 1, deadline, &err);  // until the client hangs up
  });
  {
    BackupClient client("127.0.0.1:" + std::to_string(port), 5s);
    auto b = make_state(backend.get());
    std::string why;
    uint64_t sum = 0;
    EXPECT_FALSE(client.fetch(0, 5, *b, &why, &sum));
    EXPECT_HAS(why, "checksum mismatch in transfer");
    EXPECT_EQ(sum, 0u);
  }
  holder.join();
}

// A state in device memory is received through a bounded host buffer and copied over with
// the backend's copy_from_host; the bytes arrive the same.
TEST_F(BackupServiceTest, FetchIntoDeviceMemoryGoesThroughTheBackend) {
  struct DeviceLike : ProfilingBackend {
    DeviceLike() : ProfilingBackend(make_cpu_backend(1)) {}
    DeviceKind kind() const override { return DeviceKind::kCuda; }
    void copy_from_host(void* d, const void* s, size_t n) override {
      ++copies;
      ProfilingBackend::copy_from_host(d, s, n);
    }
    int copies = 0;
  } device;
  BackupServer server(guard.job(), 1);
  BackupClient client(server.address(), 5s);
  auto seven = snapshot(7);
  client.push(*own, 7);
  auto b = make_state(&device);
  device.copies = 0;
  std::string why;
  uint64_t sum = 0;
  ASSERT_TRUE(client.fetch(0, 7, *b, &why, &sum)) << why;
  EXPECT_EQ(sum, own->find(7)->checksum);
  EXPECT_GE(device.copies, static_cast<int>(b->spans().size()));
  EXPECT_EQ(dump(*b), seven);
}

TEST_F(BackupServiceTest, OtherLayoutIsRefusedOnFetch) {
  BackupServer server(guard.job(), 1);
  BackupClient client(server.address(), 5s);
  snapshot(2);
  client.push(*own, 2);
  auto other = make_state(backend.get(), 16);
  std::string why;
  EXPECT_FALSE(client.fetch(0, 2, *other, &why));
  EXPECT_HAS(why, "layout");
  // The client reconnects after dropping the unread payload.
  auto b = make_state(backend.get());
  EXPECT_TRUE(client.fetch(0, 2, *b, &why)) << why;
}

TEST_F(BackupServiceTest, StalledAndDyingPeersDoNotHangTheServer) {
  BackupServerOptions opt;
  opt.io_timeout = 200ms;
  BackupServer server(guard.job(), 1, opt);
  snapshot(3);
  BackupClient(server.address(), 5s).push(*own, 3);
  auto deadline = detail::Clock::now() + 2s;

  // A peer that sends half a request header and stalls.
  detail::Fd stalled = detail::connect_tcp("127.0.0.1", server.port(), deadline, "test");
  char half[8] = {};
  std::string err;
  ASSERT_EQ(detail::send_all(stalled.get(), half, sizeof(half), deadline, &err),
            detail::IoResult::kOk);
  // A peer that dies in the middle of a push payload (of another layout, which must not
  // cost the backups held so far).
  {
    detail::Fd dying = detail::connect_tcp("127.0.0.1", server.port(), deadline, "test");
    authenticate_to_server(dying.get(), {"backup", 0}, deadline, "test");
    struct {
      uint32_t magic = 0x4b42524bu, op = 1;
      int32_t owner = 0;
      uint32_t reserved = 0;
      int64_t step = 12;
      uint64_t fingerprint = 1, bytes = 1 << 20, checksum = 0;
    } rq;
    ASSERT_EQ(detail::send_all(dying.get(), &rq, sizeof(rq), deadline, &err),
              detail::IoResult::kOk);
    ASSERT_EQ(detail::send_all(dying.get(), half, sizeof(half), deadline, &err),
              detail::IoResult::kOk);
  }  // closed here

  snapshot(4);
  // The stalled peer is still connected: the server answers another client all the same
  // (a server that waited on the stalled peer would leave this push to its typed timeout).
  ASSERT_TRUE(stalled.valid());
  BackupClient client(server.address(), 5s);
  ASSERT_NO_THROW(client.push(*own, 4));
  auto b = make_state(backend.get());
  std::string why;
  EXPECT_TRUE(client.fetch(0, 4, *b, &why)) << why;
  auto seg = SnapshotRegion::open_existing(backup_segment_name(guard.job(), 1));
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->valid_steps(), (std::vector<int64_t>{4, 3}));
}

// What an intruder with the holder's address can do: a FETCH with no handshake, or with a
// key of its own, gets not one byte of a snapshot; a forged PUSH changes nothing held.
TEST_F(BackupServiceTest, PeersWithoutTheJobKeyGetNothingAndPushNothing) {
  BackupServer server(guard.job(), 1);
  auto held = snapshot(7);
  BackupClient(server.address(), 5s).push(*own, 7);
  const auto deadline = detail::Clock::now() + 5s;
  struct {
    uint32_t magic = 0x4b42524bu, op = 2;  // FETCH
    int32_t owner = 0;
    uint32_t flags = 0;
    int64_t step = 7;
    uint64_t fingerprint = 0, bytes = 0, checksum = 0;
  } fetch;
  std::string err;
  {
    detail::Fd fd = detail::connect_tcp("127.0.0.1", server.port(), deadline, "intruder");
    ASSERT_EQ(detail::send_all(fd.get(), &fetch, sizeof(fetch), deadline, &err),
              detail::IoResult::kOk);
    char buf[256];
    size_t got = 0;
    for (;;) {  // until the server closes the connection
      ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
      if (n <= 0) break;
      got += size_t(n);
    }
    EXPECT_EQ(got, 0u) << "a FETCH without the job key was answered";
  }
  {
    detail::Fd fd = detail::connect_tcp("127.0.0.1", server.port(), deadline, "intruder");
    EXPECT_THROW(
        authenticate_to_server(fd.get(), {"backup", 0}, deadline, "intruder", JobKey::generate()),
        AuthError);
  }
  {
    // A forged push: a valid header and payload for step 8, no key.
    detail::Fd fd = detail::connect_tcp("127.0.0.1", server.port(), deadline, "intruder");
    struct {
      uint32_t magic = 0x4b42524bu, op = 1;  // PUSH
      int32_t owner = 0;
      uint32_t flags = 0;
      int64_t step = 8;
      uint64_t fingerprint, bytes, checksum = 0;
    } push{.fingerprint = state->layout_fingerprint(), .bytes = state->bytes()};
    detail::send_all(fd.get(), &push, sizeof(push), deadline, &err);
    std::vector<char> forged(state->bytes(), 'x');
    detail::send_all(fd.get(), forged.data(), forged.size(), deadline, &err);
  }
  auto seg = SnapshotRegion::open_existing(backup_segment_name(guard.job(), 1));
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->valid_steps(0), (std::vector<int64_t>{7}));
  auto b = make_state(backend.get());
  std::string why;
  ASSERT_TRUE(BackupClient(server.address(), 5s).fetch(0, 7, *b, &why)) << why;
  EXPECT_EQ(dump(*b), held);
}

TEST_F(BackupServiceTest, UnreachableHolderIsATypedError) {
  int port;
  {
    detail::Fd l = detail::listen_tcp("127.0.0.1", 0, 1);
    port = detail::local_port(l.get());
  }  // closed: nobody listens there now
  BackupClient client("127.0.0.1:" + std::to_string(port), 300ms);
  snapshot(1);
  // A typed error that says why: the connection was given up on (a client that retried
  // forever would never come back, and the suite's deadline fails it).
  try {
    client.push(*own, 1);
    ADD_FAILURE() << "no BackupError";
  } catch (const BackupError& e) {
    EXPECT_HAS(e.what(), "timed out connecting to backup holder");
  }
  EXPECT_THROW(client.push(*own, 99), BackupError);  // no slot holds it
}

TEST_F(BackupServiceTest, UnreadableSegmentIsReplaced) {
  const std::string name = backup_segment_name(guard.job(), 1);
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 8192), 0);
  uint64_t junk = 0x1234;
  ASSERT_EQ(::write(fd, &junk, sizeof(junk)), static_cast<ssize_t>(sizeof(junk)));
  ::close(fd);
  EXPECT_THROW(SnapshotRegion::open_existing(name), SnapshotError);

  BackupServer server(guard.job(), 1);
  snapshot(2);
  BackupClient(server.address(), 5s).push(*own, 2);
  auto seg = SnapshotRegion::open_existing(name);
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->valid_steps(), std::vector<int64_t>{2});
}

TEST_F(BackupServiceTest, RestartedServerInProcessKeepsBackups) {
  snapshot(10);
  {
    BackupServer server(guard.job(), 1);
    BackupClient(server.address(), 5s).push(*own, 10);
    server.stop();
    server.stop();  // idempotent
  }
  BackupServer again(guard.job(), 1);
  auto b = make_state(backend.get());
  std::string why;
  EXPECT_TRUE(BackupClient(again.address(), 5s).fetch(0, 10, *b, &why)) << why;
}

}  // namespace
}  // namespace keel

namespace keel {
namespace {

TEST(BackupServiceLayout, NewLayoutReplacesOldBackups) {
  auto backend = make_cpu_backend(1);
  JobGuard guard;
  BackupServer server(guard.job(), 1);
  BackupClient client(server.address(), std::chrono::seconds(5));
  for (int64_t rows : {32, 16}) {
    auto s = make_state(backend.get(), rows);
    fill(*s, static_cast<uint32_t>(rows));
    auto own = SnapshotRegion::open_or_create(snapshot_segment_name(guard.job(), int(rows)),
                                              s->bytes(), s->layout_fingerprint(), 0);
    own->write(*s, rows);
    client.push(*own, rows);
  }
  auto seg = SnapshotRegion::open_existing(backup_segment_name(guard.job(), 1));
  ASSERT_NE(seg, nullptr);
  EXPECT_EQ(seg->valid_steps(), std::vector<int64_t>{16});
  auto b = make_state(backend.get(), 16);
  std::string why;
  EXPECT_TRUE(client.fetch(0, 16, *b, &why)) << why;
}

}  // namespace
}  // namespace keel
