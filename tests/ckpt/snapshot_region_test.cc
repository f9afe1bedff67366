// Two-slot snapshot segments: round trip, the write protocol under an interrupted write,
// checksum and fingerprint refusal, survival of the writing process, and cleanup.
#include "ckpt/snapshot_region.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ckpt/checksum.h"
#include "ckpt_test_util.h"
#include "test_expect.h"

namespace keel {
namespace {

using test::dump;
using test::fill;
using test::JobGuard;
using test::make_state;

class SnapshotRegionTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  JobGuard guard;
  std::string name = snapshot_segment_name(guard.job(), 0);

  std::unique_ptr<SnapshotRegion> open_writer(TrainState& s) {
    return SnapshotRegion::open_or_create(name, s.bytes(), s.layout_fingerprint(), 0);
  }
};

TEST(Checksum, StreamEqualsOneShot) {
  std::vector<char> buf(100000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 7);
  ChecksumStream s;
  s.update(buf.data(), 1000);
  s.update(buf.data() + 1000, buf.size() - 1000);
  EXPECT_EQ(s.digest(), checksum(buf.data(), buf.size()));
  buf[500] ^= 1;
  EXPECT_NE(s.digest(), checksum(buf.data(), buf.size()));
}

TEST(SegmentNames, Format) {
  EXPECT_EQ(snapshot_segment_name("job", 3), "/keel-job-r3");
  EXPECT_EQ(backup_segment_name("job", 5), "/keel-job-b5");
  EXPECT_THROW(snapshot_segment_name("a/b", 0), InputError);
  EXPECT_THROW(snapshot_segment_name("", 0), InputError);
}

TEST_F(SnapshotRegionTest, RoundTripAndSlotAlternation) {
  auto a = make_state(backend.get());
  auto b = make_state(backend.get());
  auto region = open_writer(*a);
  EXPECT_TRUE(region->valid_steps().empty());

  fill(*a, 7);
  EXPECT_EQ(region->write(*a, 7), 0);
  EXPECT_EQ(region->valid_steps(), std::vector<int64_t>{7});
  std::string why;
  ASSERT_TRUE(region->read(7, *b, &why)) << why;
  EXPECT_EQ(dump(*a), dump(*b));

  fill(*a, 8);
  EXPECT_EQ(region->write(*a, 8), 1);
  fill(*a, 9);
  EXPECT_EQ(region->write(*a, 9), 0);  // replaces the older snapshot, 7
  EXPECT_EQ(region->valid_steps(), (std::vector<int64_t>{9, 8}));
  EXPECT_FALSE(region->read(7, *b, &why));
  EXPECT_HAS(why, "holds step 7 (valid: 9, 8)");
  ASSERT_TRUE(region->read(9, *b, &why)) << why;
  EXPECT_EQ(dump(*a), dump(*b));

  auto v = region->find(9);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->bytes, a->bytes());
  EXPECT_EQ(v->fingerprint, a->layout_fingerprint());
  EXPECT_EQ(v->owner_rank, 0);
  EXPECT_GT(v->written_at, 0);
  EXPECT_EQ(v->checksum, checksum(v->payload, v->bytes));
}

TEST_F(SnapshotRegionTest, InterruptedWriteLeavesPreviousSnapshotNewest) {
  auto a = make_state(backend.get());
  auto b = make_state(backend.get());
  auto region = open_writer(*a);
  fill(*a, 3);
  region->write(*a, 3);
  fill(*a, 4);
  region->write(*a, 4);
  auto expected = dump(*a);

  // A writer that died after invalidating the free slot, halfway through its payload.
  int slot = region->free_slot();
  EXPECT_EQ(slot, region->find(3)->slot);
  region->begin_write(slot);
  std::memset(region->payload(slot), 0xAB, a->bytes() / 2);

  EXPECT_EQ(region->valid_steps(), std::vector<int64_t>{4});
  std::string why;
  ASSERT_TRUE(region->read(4, *b, &why)) << why;
  EXPECT_EQ(dump(*b), expected);
  EXPECT_FALSE(region->read(3, *b, &why));

  // The restarted writer reopens the segment and writes into the torn slot, not over 4.
  region.reset();
  auto again = open_writer(*a);
  EXPECT_EQ(again->valid_steps(), std::vector<int64_t>{4});
  EXPECT_EQ(again->free_slot(), slot);
}

TEST_F(SnapshotRegionTest, CorruptedSlotIsRefusedAndStateUntouched) {
  auto a = make_state(backend.get());
  auto b = make_state(backend.get());
  auto region = open_writer(*a);
  fill(*a, 5);
  region->write(*a, 5);
  EXPECT_TRUE(corrupt_snapshot_slot(name, 5, 1234));
  EXPECT_FALSE(corrupt_snapshot_slot(name, 6));

  fill(*b, 99);
  auto before = dump(*b);
  std::string why;
  EXPECT_FALSE(region->read(5, *b, &why));
  EXPECT_HAS(why, "slot checksum mismatch");
  EXPECT_EQ(dump(*b), before);
  // The header stays valid: only the checksum can tell.
  EXPECT_EQ(region->valid_steps(), std::vector<int64_t>{5});
}

TEST_F(SnapshotRegionTest, OtherLayoutIsRefused) {
  auto a = make_state(backend.get());
  auto other = make_state(backend.get(), 16);
  auto region = open_writer(*a);
  fill(*a, 1);
  region->write(*a, 1);
  std::string why;
  EXPECT_FALSE(region->read(1, *other, &why));
  EXPECT_HAS(why, "layout fingerprint");

  try {
    SnapshotRegion::open_or_create(name, a->bytes(), a->layout_fingerprint() + 1, 0);
    ADD_FAILURE() << "no SnapshotError";
  } catch (const SnapshotError& e) {
    EXPECT_HAS(e.what(), name);
    EXPECT_HAS(e.what(), "layout");
  }
  try {
    SnapshotRegion::open_or_create(name, a->bytes() + 4, a->layout_fingerprint(), 0);
    ADD_FAILURE() << "no SnapshotError";
  } catch (const SnapshotError& e) {
    EXPECT_HAS(e.what(), name);
    EXPECT_HAS(e.what(), "bytes");
  }
}

// Another local user pre-creates the segment a rank will use, open to all (mode 666), to read
// the backups written into it or plant a state: neither the writer nor a reader takes it.
TEST_F(SnapshotRegionTest, APlantedSegmentOpenToOthersIsRefused) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(::fchmod(fd, 0666), 0);
  ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
  ::close(fd);
  auto a = make_state(backend.get());
  try {
    open_writer(*a);
    ADD_FAILURE() << "a segment open to others was taken";
  } catch (const SnapshotError& e) {
    EXPECT_HAS(e.what(), name);
    EXPECT_HAS(e.what(), "mode 666");
  }
  EXPECT_THROW(SnapshotRegion::open_existing(name), SnapshotError);
}

TEST_F(SnapshotRegionTest, ReadOnlyOpen) {
  EXPECT_EQ(SnapshotRegion::open_existing(name), nullptr);
  auto a = make_state(backend.get());
  auto region = open_writer(*a);
  region->write(*a, 2);
  auto ro = SnapshotRegion::open_existing(name);
  ASSERT_NE(ro, nullptr);
  EXPECT_FALSE(ro->writable());
  EXPECT_EQ(ro->valid_steps(), std::vector<int64_t>{2});
  EXPECT_EQ(ro->capacity(), a->bytes());
  EXPECT_THROW(ro->begin_write(0), Error);
}

TEST_F(SnapshotRegionTest, SnapshotOutlivesTheWritingProcess) {
  auto a = make_state(backend.get());
  fill(*a, 11);
  auto expected = dump(*a);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = 1;
    try {
      auto be = make_cpu_backend(1);
      auto s = make_state(be.get());
      fill(*s, 11);
      auto r = SnapshotRegion::open_or_create(name, s->bytes(), s->layout_fingerprint(), 0);
      r->write(*s, 11);
      rc = 0;
    } catch (...) {
    }
    ::_exit(rc);  // no unlink, no destructors of the parent's objects
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  auto b = make_state(backend.get());
  auto ro = SnapshotRegion::open_existing(name);
  ASSERT_NE(ro, nullptr);
  std::string why;
  ASSERT_TRUE(ro->read(11, *b, &why)) << why;
  EXPECT_EQ(dump(*b), expected);
  // A restarted writer keeps the slot too.
  auto writer = open_writer(*a);
  EXPECT_EQ(writer->valid_steps(), std::vector<int64_t>{11});
}

TEST(JobSegments, UnlinkLeavesShmClean) {
  auto backend = make_cpu_backend(1);
  auto s = make_state(backend.get());
  std::string job = test::unique_job();
  std::string lookalike = job + "-x";  // "keel-<job>-x-r0" is another job's segment
  for (auto n : {snapshot_segment_name(job, 0), snapshot_segment_name(job, 1),
                 backup_segment_name(job, 0), snapshot_segment_name(lookalike, 0)})
    SnapshotRegion::open_or_create(n, s->bytes(), s->layout_fingerprint(), 0);
  EXPECT_EQ(job_segments(job),
            (std::vector<std::string>{"/keel-" + job + "-b0", "/keel-" + job + "-r0",
                                      "/keel-" + job + "-r1"}));
  EXPECT_EQ(unlink_job_segments(job), 3);
  EXPECT_TRUE(job_segments(job).empty());
  EXPECT_EQ(job_segments(lookalike).size(), 1u);
  EXPECT_EQ(unlink_job_segments(lookalike), 1);
  EXPECT_NE(::access(("/dev/shm/keel-" + job + "-r0").c_str(), F_OK), 0);
  EXPECT_NE(::access(("/dev/shm/keel-" + lookalike + "-r0").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace keel
