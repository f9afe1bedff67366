// Restore: own slot first, the backup holder when the own slot is missing or corrupt, a
// typed error naming every source otherwise; and the supervisor's restorable_steps().
#include "ckpt/restore.h"

#include <gtest/gtest.h>

#include <chrono>

#include "ckpt/backup_service.h"
#include "ckpt/snapshot_region.h"
#include "ckpt_test_util.h"
#include "test_expect.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using test::dump;
using test::fill;
using test::JobGuard;
using test::make_state;

class RestoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  JobGuard guard;
  std::unique_ptr<TrainState> state = make_state(backend.get());
  std::string own_name = snapshot_segment_name(guard.job(), 0);
  std::unique_ptr<SnapshotRegion> own =
      SnapshotRegion::open_or_create(own_name, state->bytes(), state->layout_fingerprint(), 0);
  BackupServer server{guard.job(), 1};

  std::vector<char> snapshot(int64_t s, bool push) {
    fill(*state, static_cast<uint32_t>(s));
    own->write(*state, s);
    if (push) BackupClient(server.address(), 5s).push(*own, s);
    return dump(*state);
  }
};

TEST_F(RestoreTest, OwnSlotFirst) {
  auto four = snapshot(4, true);
  auto b = make_state(backend.get());
  RestoreResult r = restore_state(*b, 4, own.get(), server.address(), 0, 1);
  EXPECT_HAS(r.source, "own slot");
  EXPECT_TRUE(r.skipped.empty());
  EXPECT_EQ(b->step(), 4);
  EXPECT_EQ(dump(*b), four);
}

TEST_F(RestoreTest, CorruptOwnSlotFallsBackToBackup) {
  auto four = snapshot(4, true);
  ASSERT_TRUE(corrupt_snapshot_slot(own_name, 4, 10));
  auto b = make_state(backend.get());
  RestoreResult r = restore_state(*b, 4, own.get(), server.address(), 0, 1);
  EXPECT_HAS(r.source, "backup held by rank 1");
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_HAS(r.skipped[0], "checksum mismatch");
  EXPECT_EQ(b->step(), 4);
  EXPECT_EQ(dump(*b), four);

  // A promoted standby has no own segment at all.
  auto c = make_state(backend.get());
  r = restore_state(*c, 4, nullptr, server.address(), 0, 1);
  EXPECT_HAS(r.source, "backup");
  EXPECT_EQ(dump(*c), four);
}

// Surveys read headers only; the restore verifies. A damaged own slot with no other copy
// of its step fails the restore and is dropped, so the next survey offers the older step.
TEST_F(RestoreTest, DamagedOnlyCopyIsDroppedForTheNextSurvey) {
  auto four = snapshot(4, true);
  snapshot(5, false);  // own slots: 5, 4; backup: 4
  ASSERT_TRUE(corrupt_snapshot_slot(own_name, 5, 3));
  EXPECT_EQ(restorable_steps(guard.job(), 0, 1), (std::vector<int64_t>{5, 4}));
  auto b = make_state(backend.get());
  try {
    restore_state(*b, 5, own.get(), server.address(), 0, 1);
    ADD_FAILURE() << "no RestoreError";
  } catch (const RestoreError& e) {
    EXPECT_HAS(e.what(), "checksum mismatch");
    EXPECT_HAS(e.what(), "holds no backup of rank 0 at step 5");
  }
  EXPECT_EQ(restorable_steps(guard.job(), 0, 1), std::vector<int64_t>{4});
  RestoreResult r = restore_state(*b, 4, own.get(), server.address(), 0, 1);
  EXPECT_HAS(r.source, "own slot");
  EXPECT_EQ(dump(*b), four);
}

TEST_F(RestoreTest, NoSourceThrowsNamingEverySource) {
  snapshot(4, true);
  auto b = make_state(backend.get());
  b->set_step(1);
  try {
    restore_state(*b, 9, own.get(), server.address(), 0, 1);
    ADD_FAILURE() << "no RestoreError";
  } catch (const RestoreError& e) {
    EXPECT_HAS(e.what(), "cannot restore rank 0 to step 9");
    EXPECT_HAS(e.what(), "own slot");
    EXPECT_HAS(e.what(), "no slot of " + own_name + " holds step 9");
    EXPECT_HAS(e.what(), "backup held by rank 1");
    EXPECT_HAS(e.what(), "holds no backup of rank 0 at step 9");
  }
  EXPECT_EQ(b->step(), 1);
  // A dead holder is one more reason, not a hang.
  std::string dead = server.address();
  server.stop();
  try {
    restore_state(*b, 9, nullptr, dead, 0, 1, 300ms);
    ADD_FAILURE() << "no RestoreError";
  } catch (const RestoreError& e) {
    EXPECT_HAS(e.what(), "own slot: no snapshot segment");
    EXPECT_HAS(e.what(), dead);
  }
}

TEST_F(RestoreTest, RestorableStepsUnionsOwnAndBackup) {
  EXPECT_TRUE(restorable_steps(guard.job(), 0, 1).empty());
  snapshot(3, true);
  snapshot(4, false);
  snapshot(5, false);  // own slots: 5, 4; backup: 3
  EXPECT_EQ(restorable_steps(guard.job(), 0, 1), (std::vector<int64_t>{5, 4, 3}));
  EXPECT_EQ(restorable_steps(guard.job(), 0, -1), (std::vector<int64_t>{5, 4}));
  // Backups held for another rank do not count.
  EXPECT_EQ(restorable_steps(guard.job(), 2, 1), std::vector<int64_t>{});
}

}  // namespace
}  // namespace keel
