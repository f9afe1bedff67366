// The snapshotter: copying (as on a GPU: capture/wait_idle, slot alternation, pushes to a live,
// dead and stalled backup holder) and with the state living in its slots (the update is the
// snapshot; adopt, rewrite, detach).
#include "ckpt/snapshotter.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "ckpt/backup_service.h"
#include "ckpt/checksum.h"
#include "ckpt/snapshot_region.h"
#include "ckpt_test_util.h"
#include "parallel/socket_util.h"
#include "test_expect.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using test::dump;
using test::fill;
using test::JobGuard;
using test::make_state;

class SnapshotterTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  JobGuard guard;
  std::unique_ptr<TrainState> state = make_state(backend.get());
  std::unique_ptr<SnapshotRegion> region = SnapshotRegion::open_or_create(
      snapshot_segment_name(guard.job(), 0), state->bytes(), state->layout_fingerprint(), 0);

  static SnapshotterOptions copying() {
    SnapshotterOptions o;
    o.state_in_slots = false;
    return o;
  }

  // One training step as the worker's hooks see it: the update writes the state, then the
  // after-step hook captures.
  std::vector<char> step(Snapshotter& snap, int64_t s) {
    snap.wait_idle();  // before the optimizer update
    fill(*state, static_cast<uint32_t>(s));
    state->set_step(s);
    snap.capture();
    return dump(*state);
  }
};

TEST_F(SnapshotterTest, CaptureAlternatesSlots) {
  Snapshotter snap(state.get(), region.get(), copying());
  std::vector<std::vector<char>> expected;
  for (int64_t s = 1; s <= 4; ++s) {
    expected.push_back(step(snap, s));
    snap.wait_idle();
    auto v = region->find(s);
    ASSERT_TRUE(v);
    EXPECT_EQ(v->slot, static_cast<int>((s - 1) % 2));
    if (s > 1) {
      EXPECT_EQ(region->valid_steps(), (std::vector<int64_t>{s, s - 1}));
    }
  }
  auto b = make_state(backend.get());
  std::string why;
  ASSERT_TRUE(region->read(3, *b, &why)) << why;
  EXPECT_EQ(dump(*b), expected[2]);
  ASSERT_TRUE(region->read(4, *b, &why)) << why;
  EXPECT_EQ(dump(*b), expected[3]);
  SnapshotStats st = snap.stats();
  EXPECT_EQ(st.copies, 4);
  EXPECT_EQ(st.last_committed_step, 4);
  EXPECT_EQ(st.pushes, 0);
  EXPECT_GE(st.copy_seconds, 0);
  snap.stop();
  snap.stop();
}

TEST_F(SnapshotterTest, CaptureAfterRestoreSupersedesStaleSnapshots) {
  BackupServer server(guard.job(), 1);
  Snapshotter snap(state.get(), region.get(), copying());
  snap.set_backup_holder(server.address());
  step(snap, 5);
  snap.wait_pushed();
  step(snap, 6);  // a step whose result the job later rolls back
  snap.wait_pushed();
  // Recovery: every rank restores step 5 and runs step 6 again, here with other results.
  snap.wait_idle();
  std::string why;
  ASSERT_TRUE(region->read(5, *state, &why)) << why;
  fill(*state, 600);
  state->set_step(6);
  snap.capture();
  snap.wait_pushed();
  auto redone = dump(*state);
  EXPECT_EQ(region->valid_steps(), (std::vector<int64_t>{6, 5}));
  auto b = make_state(backend.get());
  ASSERT_TRUE(region->read(6, *b, &why)) << why;
  EXPECT_EQ(dump(*b), redone);
  auto c = make_state(backend.get());
  ASSERT_TRUE(BackupClient(server.address(), 5s).fetch(0, 6, *c, &why)) << why;
  EXPECT_EQ(dump(*c), redone);
  auto held = SnapshotRegion::open_existing(backup_segment_name(guard.job(), 1));
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->valid_steps(), (std::vector<int64_t>{6, 5}));
}

TEST_F(SnapshotterTest, PushesEachSnapshotToTheHolder) {
  BackupServer server(guard.job(), 1);
  Snapshotter snap(state.get(), region.get(), copying());
  snap.set_backup_holder(server.address());
  std::vector<char> last;
  for (int64_t s = 1; s <= 3; ++s) {
    last = step(snap, s);
    snap.wait_pushed();
  }
  SnapshotStats st = snap.stats();
  EXPECT_EQ(st.pushes, 3);
  EXPECT_EQ(st.pushes_failed, 0);
  EXPECT_EQ(st.bytes_pushed, static_cast<int64_t>(3 * state->bytes()));
  EXPECT_EQ(st.last_pushed_step, 3);
  auto b = make_state(backend.get());
  std::string why;
  ASSERT_TRUE(BackupClient(server.address(), 5s).fetch(0, 3, *b, &why)) << why;
  EXPECT_EQ(dump(*b), last);
}

TEST_F(SnapshotterTest, DeadHolderIsCountedNotFatal) {
  // The holder takes the first push's connection and dies: that push fails at once (no
  // timeout involved), and from then on nobody listens on its port.
  detail::Fd listener = detail::listen_tcp("127.0.0.1", 0, 1);
  const int port = detail::local_port(listener.get());
  std::thread holder([&] {
    pollfd p{listener.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 60'000), 1);
    ::close(::accept(listener.get(), nullptr, nullptr));
  });
  SnapshotterOptions opt = copying();
  // A refused connection is retried for connect_timeout by a push that is not degraded: an
  // hour, so only the degraded timeout (50 ms) can end the second push before the deadline.
  opt.connect_timeout = std::chrono::hours(1);
  opt.degraded_timeout = 50ms;
  Snapshotter snap(state.get(), region.get(), opt);
  snap.set_backup_holder("127.0.0.1:" + std::to_string(port));
  step(snap, 1);
  snap.wait_pushed();
  holder.join();
  listener.reset();
  ASSERT_EQ(snap.stats().pushes_failed, 1);
  // Once a push has failed, the next ones give up quickly: a dead holder must not slow
  // every step by the full timeout until the rebuild.
  test::expect_returns(
      [&] {
        step(snap, 2);
        snap.wait_pushed();
      },
      "the push after a failed one (the full connect timeout instead of the degraded one?)", 60s);
  SnapshotStats st = snap.stats();
  EXPECT_EQ(st.copies, 2);
  EXPECT_EQ(st.pushes_failed, 2);
  EXPECT_FALSE(st.last_push_error.empty());

  // After a rebuild the worker points the snapshotter at the new holder.
  BackupServer server(guard.job(), 2);
  snap.set_backup_holder(server.address());
  step(snap, 3);
  snap.wait_pushed();
  st = snap.stats();
  EXPECT_EQ(st.pushes, 1);
  EXPECT_EQ(st.last_pushed_step, 3);
  EXPECT_TRUE(st.last_push_error.empty());
}

TEST_F(SnapshotterTest, SlotInFlightIsNotOverwritten) {
  // A holder that accepts connections (the kernel does, from the backlog) but never answers:
  // each push stalls until its timeout.
  detail::Fd silent = detail::listen_tcp("127.0.0.1", 0, 8);
  SnapshotterOptions opt = copying();
  opt.push_timeout = 1000ms;
  opt.degraded_timeout = 100ms;
  Snapshotter snap(state.get(), region.get(), opt);
  snap.set_backup_holder("127.0.0.1:" + std::to_string(detail::local_port(silent.get())));
  step(snap, 1);  // slot 0, its push stalls
  for (int i = 0; i < 2000 && snap.stats().push_in_flight_step != 1; ++i)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(snap.stats().push_in_flight_step, 1);
  step(snap, 2);  // slot 1
  EXPECT_EQ(snap.stats().pushes_failed, 0);
  auto three = step(snap, 3);  // needs slot 0 again: must wait for the push of step 1
  snap.wait_idle();
  // The copy of step 3 ended after the push of step 1 did (it stalls until push_timeout,
  // then fails): the order of the two events, not the time it took.
  EXPECT_NE(snap.stats().push_in_flight_step, 1);
  EXPECT_GE(snap.stats().pushes_failed, 1);
  EXPECT_EQ(region->valid_steps(), (std::vector<int64_t>{3, 2}));
  auto b = make_state(backend.get());
  std::string why;
  ASSERT_TRUE(region->read(3, *b, &why)) << why;
  EXPECT_EQ(dump(*b), three);
  EXPECT_GT(snap.stats().wait_idle_seconds, 0);  // the wait is counted
  snap.set_backup_holder("");                    // drop what is pending so stop() is quick
  snap.stop();
  EXPECT_GE(snap.stats().pushes_failed, 1);
}

// An update as the Trainer makes it with the state in its slots: written into the other
// bank, checksummed, committed.
std::vector<char> update_in_slots(TrainState& state, int64_t s) {
  std::optional<TrainState::Target> t = state.update_begin();
  EXPECT_TRUE(t);
  if (!t) return {};
  auto* p = reinterpret_cast<char*>(t->params);
  for (size_t i = 0; i < state.bytes(); ++i) p[i] = static_cast<char>((i * 131 + s * 7) % 251);
  std::vector<char> bytes(p, p + state.bytes());
  state.update_commit(*t, s, checksum(p, state.bytes()));
  return bytes;
}

TEST_F(SnapshotterTest, InSlotsTheUpdateIsTheSnapshot) {
  Snapshotter snap(state.get(), region.get());
  ASSERT_TRUE(snap.in_slots());
  fill(*state, 1);  // the start state, in the state's own memory until the first update
  std::vector<std::vector<char>> expected;
  for (int64_t s = 1; s <= 3; ++s) {
    expected.push_back(update_in_slots(*state, s));
    snap.capture();  // nothing left to copy
    auto v = region->find(s);
    ASSERT_TRUE(v);
    // No copy: the live parameters are the slot's payload.
    EXPECT_EQ(static_cast<const void*>(v->payload), static_cast<void*>(state->spans()[0].data));
    EXPECT_EQ(state->live_bank(), v->slot);
    EXPECT_EQ(dump(*state), expected.back());
  }
  EXPECT_EQ(region->valid_steps(), (std::vector<int64_t>{3, 2}));
  auto b = make_state(backend.get());
  std::string why;
  ASSERT_TRUE(region->read(2, *b, &why)) << why;  // the checksum the update wrote holds
  EXPECT_EQ(dump(*b), expected[1]);
  EXPECT_EQ(snap.stats().copies, 3);
  EXPECT_DOUBLE_EQ(snap.stats().copy_seconds, 0);
  // stop() moves the state back into its own memory: it survives the region.
  snap.stop();
  EXPECT_EQ(state->live_bank(), -1);
  region.reset();
  EXPECT_EQ(dump(*state), expected[2]);
}

TEST_F(SnapshotterTest, InSlotsEachUpdateIsPushed) {
  BackupServer server(guard.job(), 1);
  Snapshotter snap(state.get(), region.get());
  snap.set_backup_holder(server.address());
  std::vector<char> last;
  for (int64_t s = 1; s <= 3; ++s) {
    last = update_in_slots(*state, s);
    snap.wait_pushed();
  }
  EXPECT_EQ(snap.stats().pushes, 3);
  auto b = make_state(backend.get());
  std::string why;
  ASSERT_TRUE(BackupClient(server.address(), 5s).fetch(0, 3, *b, &why)) << why;
  EXPECT_EQ(dump(*b), last);
}

TEST_F(SnapshotterTest, InSlotsAdoptRestoresWithoutACopyAndForgetsTheUndoneStep) {
  Snapshotter snap(state.get(), region.get());
  update_in_slots(*state, 1);
  auto two = update_in_slots(*state, 2);
  update_in_slots(*state, 3);
  std::string why;
  ASSERT_TRUE(snap.adopt(2, &why)) << why;
  EXPECT_EQ(state->step(), 2);
  EXPECT_EQ(dump(*state), two);
  EXPECT_EQ(region->valid_steps(), (std::vector<int64_t>{2}));  // step 3 was undone
  EXPECT_FALSE(snap.adopt(3, &why));
  EXPECT_NE(why.find("holds step 3"), std::string::npos) << why;
  // A corrupted slot is refused and the state is left as it was.
  update_in_slots(*state, 3);
  ASSERT_TRUE(corrupt_snapshot_slot(region->name(), 2, 99));
  auto three = dump(*state);
  EXPECT_FALSE(snap.adopt(2, &why));
  EXPECT_NE(why.find("checksum mismatch"), std::string::npos) << why;
  EXPECT_EQ(state->step(), 3);
  EXPECT_EQ(dump(*state), three);
}

TEST_F(SnapshotterTest, InSlotsRewriteKeepsTheLiveSnapshotUntilCommitted) {
  Snapshotter snap(state.get(), region.get());
  update_in_slots(*state, 1);
  auto two = update_in_slots(*state, 2);
  {
    StateRewrite rw(*state);
    fill(*state, 77);
    EXPECT_EQ(region->valid_steps(), (std::vector<int64_t>{2}));  // the write target is out
    // Leaving without commit() (an exception in a restore) goes back to step 2.
  }
  EXPECT_EQ(dump(*state), two);
  EXPECT_EQ(state->step(), 2);
  {
    StateRewrite rw(*state);
    fill(*state, 78);
    state->set_step(7);
    rw.commit();
  }
  auto seven = dump(*state);
  EXPECT_EQ(region->valid_steps(), (std::vector<int64_t>{7, 2}));
  auto b = make_state(backend.get());
  std::string why;
  ASSERT_TRUE(region->read(7, *b, &why)) << why;
  EXPECT_EQ(dump(*b), seven);
}

}  // namespace
}  // namespace keel
