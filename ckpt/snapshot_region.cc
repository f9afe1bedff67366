// Two-slot snapshot segments in POSIX shared memory; see snapshot_region.h.
#include "ckpt/snapshot_region.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "ckpt/checksum.h"
#include "model/train_state.h"
#include "runtime/logging.h"

namespace keel {

namespace {

constexpr uint64_t kMagic = 0x31504e5346454b4bULL;  // "KKEFSNP1"
// 2: payload checksums are block checksums (ckpt/checksum.h).
constexpr uint32_t kVersion = 3;  // 3: a third slot, for the verified snapshot
// Payloads start on page boundaries so device-to-host copies and checksums run aligned.
constexpr size_t kPage = 4096;

// Processes share the step counters through the mapping, so they must be plain lock-free
// words (address-free atomics).
static_assert(std::atomic<int64_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

// A segment keel did not make is refused, not used: keel makes every segment 0600 as the
// job's user (O_EXCL), so one that another user owns, or that others may read or write, was
// planted (its name is predictable: the job id is on every agent's command line) to read the
// backups written into it or to have a state restored from it.
void refuse_if_not_ours(int fd, const std::string& name) {
  struct stat st {};
  KEEL_CHECK_ERRNO(::fstat(fd, &st));
  if (st.st_uid == ::geteuid() && (st.st_mode & 077) == 0 && S_ISREG(st.st_mode)) return;
  throw SnapshotError(detail::concat(
      "shared-memory segment ", name, " is refused: owned by uid ", st.st_uid, " with mode ",
      std::oct, st.st_mode & 07777, std::dec, ", not this job's (uid ", ::geteuid(),
      ", mode 600): another user made or opened it up; remove it if it is not theirs"));
}

std::string checked_job(const std::string& job) {
  if (job.empty() || job.find('/') != std::string::npos)
    throw InputError(detail::concat("job name \"", job, "\" must be non-empty and contain no '/'"));
  return job;
}

// Owns a file descriptor just long enough to map it.
struct ScopedFd {
  int fd;
  ~ScopedFd() {
    if (fd >= 0) ::close(fd);
  }
};

// Faults every page of a new segment in now, at start-up: otherwise the first writes of
// each slot (the first two steps, when the state lives in the slots) pay a page fault per
// 4 KiB. MADV_POPULATE_WRITE needs Linux 5.14; older kernels get a write per page.
void populate(void* base, size_t bytes) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
  if (::madvise(base, bytes, MADV_POPULATE_WRITE) == 0) return;
  KEEL_CHECK(errno == EINVAL, "madvise(MADV_POPULATE_WRITE) of ", bytes,
             " bytes: ", std::strerror(errno));
  auto* p = static_cast<volatile char*>(base);
  for (size_t off = 0; off < bytes; off += kPage) p[off] = 0;
}

}  // namespace

struct SnapshotRegion::Header {
  struct Slot {
    std::atomic<int64_t> step;  // -1: invalid; written last on commit, first on overwrite
    uint64_t bytes;
    uint64_t checksum;
    uint64_t fingerprint;
    int32_t owner_rank;
    int32_t verified;  // the SDC checks passed on this state (the verified slot)
    int64_t written_at;
  };
  // Written last at creation: a segment whose creator died before finishing reads as absent.
  std::atomic<uint64_t> magic;
  uint32_t version;
  uint32_t num_slots;
  uint64_t capacity;  // bytes per slot payload
  uint64_t fingerprint;
  int32_t owner_rank;
  int32_t reserved;
  Slot slots[kSlots];
};

namespace {
size_t payload_offset() {
  return kPage;
}  // the header fits one page (static_assert below)
size_t slot_stride(size_t capacity) {
  return round_up(std::max<size_t>(capacity, 1), kPage);
}
size_t segment_bytes(size_t capacity) {
  return payload_offset() + SnapshotRegion::kSlots * slot_stride(capacity);
}
}  // namespace

std::string snapshot_segment_name(const std::string& job, int rank) {
  return detail::concat("/keel-", checked_job(job), "-r", rank);
}

std::string backup_segment_name(const std::string& job, int holder_rank) {
  return detail::concat("/keel-", checked_job(job), "-b", holder_rank);
}

std::vector<std::string> job_segments(const std::string& job, const std::string& shm_dir) {
  std::string prefix = "keel-" + checked_job(job) + "-";
  std::vector<std::string> out;
  DIR* dir = ::opendir(shm_dir.c_str());
  KEEL_CHECK(dir != nullptr, "opendir ", shm_dir, ": ", std::strerror(errno));
  while (dirent* e = ::readdir(dir)) {
    std::string n = e->d_name;
    if (n.size() <= prefix.size() + 1 || n.compare(0, prefix.size(), prefix) != 0) continue;
    // Exactly "r<digits>" or "b<digits>" after the prefix, so job "a" never matches "a-b-r0".
    std::string rest = n.substr(prefix.size());
    if ((rest[0] != 'r' && rest[0] != 'b') ||
        !std::all_of(rest.begin() + 1, rest.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    out.push_back("/" + n);
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// The paths own_segments_until_exit() registered, as plain arrays: a signal handler may not
// allocate. g_owned_count is published after the paths are written.
constexpr int kOwned = 2;  // the snapshot and the backup segment
char g_owned[kOwned][256];
std::atomic<int> g_owned_count{0};

extern "C" void remove_owned_then_die(int sig) {
  remove_owned_segments();
  // SA_RESETHAND restored the default action; the signal, blocked while this runs, ends the
  // process as it would have when the handler returns.
  raise(sig);
}

}  // namespace

void own_segments_until_exit(const std::string& job, int rank) {
  g_owned_count.store(0, std::memory_order_release);
  int n = 0;
  for (const std::string& name :
       {snapshot_segment_name(job, rank), backup_segment_name(job, rank)}) {
    const std::string path = "/dev/shm" + name;  // where shm_open puts "/<name>" on Linux
    KEEL_CHECK(path.size() < sizeof(g_owned[0]), "segment path too long: ", path);
    std::memcpy(g_owned[n], path.c_str(), path.size() + 1);
    ++n;
  }
  g_owned_count.store(n, std::memory_order_release);
  struct sigaction sa {};
  sa.sa_handler = remove_owned_then_die;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) KEEL_CHECK_ERRNO(sigaction(sig, &sa, nullptr));
}

void remove_owned_segments() {
  const int n = g_owned_count.load(std::memory_order_acquire);
  // ENOENT (never created, or already removed) is the outcome wanted; nothing else can be
  // reported from a signal handler.
  for (int i = 0; i < n; ++i) (void)::unlink(g_owned[i]);
}

int unlink_job_segments(const std::string& job) {
  int n = 0;
  for (const auto& name : job_segments(job)) {
    if (::shm_unlink(name.c_str()) == 0) {
      ++n;
    } else {
      // Someone else unlinked it between listing and now; that is the outcome we want.
      KEEL_CHECK(errno == ENOENT, "shm_unlink ", name, ": ", std::strerror(errno));
    }
  }
  return n;
}

SnapshotRegion::SnapshotRegion(std::string name, void* base, size_t mapped, bool writable)
    : name_(std::move(name)), base_(base), mapped_(mapped), writable_(writable) {}

SnapshotRegion::~SnapshotRegion() {
  if (populating_.joinable()) populating_.join();
  ::munmap(base_, mapped_);
}

SnapshotRegion::Header* SnapshotRegion::header() const {
  return static_cast<Header*>(base_);
}

size_t SnapshotRegion::verified_slot_bytes() const {
  return slot_stride(capacity());
}
size_t SnapshotRegion::capacity() const {
  return header()->capacity;
}
uint64_t SnapshotRegion::fingerprint() const {
  return header()->fingerprint;
}
int SnapshotRegion::owner_rank() const {
  return header()->owner_rank;
}

std::unique_ptr<SnapshotRegion> SnapshotRegion::open_or_create(const std::string& name,
                                                               size_t capacity,
                                                               uint64_t fingerprint, int owner_rank,
                                                               bool populate_in_background) {
  static_assert(sizeof(Header) <= kPage);
  const size_t total = segment_bytes(capacity);
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  bool fresh = fd >= 0;
  if (!fresh) {
    KEEL_CHECK(errno == EEXIST, "shm_open ", name, ": ", std::strerror(errno));
    KEEL_CHECK_ERRNO(fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600));
  }
  ScopedFd guard{fd};
  if (!fresh) refuse_if_not_ours(fd, name);
  struct stat st {};
  KEEL_CHECK_ERRNO(::fstat(fd, &st));
  if (!fresh && static_cast<size_t>(st.st_size) >= sizeof(Header)) {
    void* base = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    KEEL_CHECK(base != MAP_FAILED, "mmap ", name, ": ", std::strerror(errno));
    std::unique_ptr<SnapshotRegion> r(new SnapshotRegion(name, base, st.st_size, true));
    const Header* h = r->header();
    if (h->magic.load(std::memory_order_acquire) == kMagic) {
      if (h->version != kVersion || h->num_slots != kSlots)
        throw SnapshotError(detail::concat("snapshot segment ", name, " has format version ",
                                           h->version, ", this build writes ", kVersion));
      if (h->capacity != capacity)
        throw SnapshotError(detail::concat("snapshot segment ", name, " holds slots of ",
                                           h->capacity, " bytes, this state needs ", capacity));
      if (h->fingerprint != fingerprint)
        throw SnapshotError(detail::concat("snapshot segment ", name, " was made for layout ",
                                           std::hex, h->fingerprint, ", this state's is ",
                                           fingerprint));
      if (static_cast<size_t>(st.st_size) < total)
        throw SnapshotError(detail::concat("snapshot segment ", name, " is truncated: ", st.st_size,
                                           " bytes, expected ", total));
      return r;
    }
    // The creator died before finishing the header: nothing in it was ever valid.
  }
  KEEL_CHECK_ERRNO(::ftruncate(fd, 0));  // drops any half-made contents
  KEEL_CHECK_ERRNO(::ftruncate(fd, static_cast<off_t>(total)));
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  KEEL_CHECK(base != MAP_FAILED, "mmap ", name, ": ", std::strerror(errno));
  // The verified slot is left unfaulted: it costs memory only once a check fills it.
  const size_t rotating = payload_offset() + kRotatingSlots * slot_stride(capacity);
  std::unique_ptr<SnapshotRegion> r(new SnapshotRegion(name, base, total, true));
  if (!populate_in_background) {
    populate(base, rotating);
  } else {
    r->populating_ = std::thread([base, rotating, name] {
      // Only on a core nothing else wants: the rank's restore and first step come first.
      sched_param none{};
      ::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &none);
      try {
        populate(base, rotating);
      } catch (const Error& e) {
        // /dev/shm cannot hold the slots: the first snapshot written will fail (SIGBUS) and
        // the rank with it, which the controller recovers from like any rank's death.
        LOG(ERROR) << "snapshot segment " << name << ": " << e.what();
      }
    });
  }
  Header* h = r->header();
  h->version = kVersion;
  h->num_slots = kSlots;
  h->capacity = capacity;
  h->fingerprint = fingerprint;
  h->owner_rank = owner_rank;
  for (auto& s : h->slots) s.step.store(-1, std::memory_order_relaxed);
  h->magic.store(kMagic, std::memory_order_release);
  return r;
}

std::unique_ptr<SnapshotRegion> SnapshotRegion::open_existing(const std::string& name,
                                                              bool writable) {
  int fd = ::shm_open(name.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
  if (fd < 0) {
    KEEL_CHECK(errno == ENOENT, "shm_open ", name, ": ", std::strerror(errno));
    return nullptr;
  }
  ScopedFd guard{fd};
  refuse_if_not_ours(fd, name);
  struct stat st {};
  KEEL_CHECK_ERRNO(::fstat(fd, &st));
  if (static_cast<size_t>(st.st_size) < sizeof(Header)) return nullptr;  // still being made
  int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* base = ::mmap(nullptr, st.st_size, prot, MAP_SHARED, fd, 0);
  KEEL_CHECK(base != MAP_FAILED, "mmap ", name, ": ", std::strerror(errno));
  std::unique_ptr<SnapshotRegion> r(new SnapshotRegion(name, base, st.st_size, writable));
  const Header* h = r->header();
  uint64_t magic = h->magic.load(std::memory_order_acquire);
  if (magic == 0) return nullptr;  // creator has not finished (or died doing so)
  if (magic != kMagic || h->version != kVersion || h->num_slots != kSlots)
    throw SnapshotError(detail::concat("shared-memory segment ", name,
                                       " is not a keel snapshot segment of format ", kVersion));
  if (static_cast<size_t>(st.st_size) < segment_bytes(h->capacity))
    throw SnapshotError(detail::concat("snapshot segment ", name, " is truncated: ", st.st_size,
                                       " bytes for slots of ", h->capacity));
  return r;
}

std::optional<SlotView> SnapshotRegion::slot_view(int slot) const {
  KEEL_CHECK(slot >= 0 && slot < kSlots, "bad slot ", slot);
  const Header::Slot& s = header()->slots[slot];
  int64_t step = s.step.load(std::memory_order_acquire);
  if (step < 0) return std::nullopt;
  SlotView v;
  v.slot = slot;
  v.step = step;
  v.payload = static_cast<const char*>(base_) + payload_offset() +
              slot * round_up(std::max<size_t>(capacity(), 1), kPage);
  v.bytes = s.bytes;
  v.checksum = s.checksum;
  v.fingerprint = s.fingerprint;
  v.owner_rank = s.owner_rank;
  v.written_at = s.written_at;
  v.verified = s.verified != 0;
  if (v.bytes > capacity()) return std::nullopt;  // a damaged header never points past the slot
  return v;
}

std::vector<int64_t> SnapshotRegion::valid_steps(int owner) const {
  std::vector<int64_t> out;
  for (int i = 0; i < kSlots; ++i) {
    auto v = slot_view(i);
    if (v && (owner < 0 || v->owner_rank == owner)) out.push_back(v->step);
  }
  std::sort(out.rbegin(), out.rend());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<SlotView> SnapshotRegion::find(int64_t step, int owner) const {
  for (int i = 0; i < kSlots; ++i) {
    auto v = slot_view(i);
    if (v && v->step == step && (owner < 0 || v->owner_rank == owner)) return v;
  }
  return std::nullopt;
}

bool SnapshotRegion::verify(const SlotView& v, std::string* why) {
  uint64_t got = checksum(v.payload, v.bytes);
  if (got == v.checksum) return true;
  if (why)
    *why = detail::concat("slot checksum mismatch (step ", v.step, ": header ", std::hex,
                          v.checksum, ", payload ", got, ")");
  return false;
}

int SnapshotRegion::free_slot() const {
  int newest = -1;
  int64_t newest_step = -1;
  for (int i = 0; i < kRotatingSlots; ++i) {
    auto v = slot_view(i);
    if (v && v->step > newest_step) newest = i, newest_step = v->step;
  }
  return newest < 0 ? 0 : (newest + 1) % kRotatingSlots;
}

int SnapshotRegion::invalidate_from(int64_t step, int owner) {
  int n = 0;
  for (int i = 0; i < kSlots; ++i) {
    auto v = slot_view(i);
    if (v && v->step >= step && (owner < 0 || v->owner_rank == owner)) {
      begin_write(i);
      ++n;
    }
  }
  return n;
}

void SnapshotRegion::begin_write(int slot) {
  KEEL_CHECK(writable_, "snapshot segment ", name_, " is open read-only");
  KEEL_CHECK(slot >= 0 && slot < kSlots, "bad slot ", slot);
  header()->slots[slot].step.store(-1, std::memory_order_release);
  // The invalidation must be visible before any payload byte changes, or a reader in
  // another process could see the old step with a half-new payload.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

char* SnapshotRegion::payload(int slot) {
  KEEL_CHECK(writable_, "snapshot segment ", name_, " is open read-only");
  KEEL_CHECK(slot >= 0 && slot < kSlots, "bad slot ", slot);
  return static_cast<char*>(base_) + payload_offset() +
         slot * round_up(std::max<size_t>(capacity(), 1), kPage);
}

void SnapshotRegion::commit(int slot, int64_t step, size_t bytes, uint64_t sum,
                            uint64_t fingerprint, int owner_rank, bool verified) {
  KEEL_CHECK(writable_, "snapshot segment ", name_, " is open read-only");
  KEEL_CHECK(slot >= 0 && slot < kSlots && step >= 0 && bytes <= capacity(), "bad commit of slot ",
             slot, " step ", step, " bytes ", bytes, " into ", name_);
  Header::Slot& s = header()->slots[slot];
  s.bytes = bytes;
  s.checksum = sum;
  s.fingerprint = fingerprint;
  s.owner_rank = owner_rank;
  s.verified = verified ? 1 : 0;
  s.written_at = static_cast<int64_t>(std::time(nullptr));
  s.step.store(step, std::memory_order_release);
}

int SnapshotRegion::write(TrainState& state, int64_t step, int slot, bool verified) {
  KEEL_CHECK(state.bytes() <= capacity(), "state of ", state.bytes(), " bytes does not fit ", name_,
             " (", capacity(), ")");
  if (slot < 0) slot = free_slot();
  begin_write(slot);
  char* dst = payload(slot);
  size_t off = 0;
  // Checksummed from the host copy, so it covers exactly the bytes a reader will load; chunk
  // by chunk right after each copy, while the chunk is still in cache: one pass over memory
  // instead of two.
  constexpr size_t kChunk = size_t(1) << 20;
  ChecksumStream sum;
  for (const StateSpan& s : state.spans()) {
    const char* src = reinterpret_cast<const char*>(s.data);
    for (size_t done = 0; done < s.bytes(); done += kChunk) {
      const size_t n = std::min(kChunk, s.bytes() - done);
      state.backend()->copy_to_host(dst + off, src + done, n);
      sum.update(dst + off, n);
      off += n;
    }
  }
  commit(slot, step, off, sum.digest(), state.layout_fingerprint(), owner_rank(), verified);
  return slot;
}

bool SnapshotRegion::read(int64_t step, TrainState& state, std::string* why) const {
  std::string local;
  if (!why) why = &local;
  auto v = find(step);
  if (!v) {
    std::string held;
    for (int64_t s : valid_steps()) held += (held.empty() ? "" : ", ") + std::to_string(s);
    *why = detail::concat("no slot of ", name_, " holds step ", step,
                          " (valid: ", held.empty() ? "none" : held, ")");
    return false;
  }
  if (v->fingerprint != state.layout_fingerprint()) {
    *why =
        detail::concat("slot of step ", step, " in ", name_, " has layout fingerprint ", std::hex,
                       v->fingerprint, ", the state's is ", state.layout_fingerprint());
    return false;
  }
  if (v->bytes != state.bytes()) {
    *why = detail::concat("slot of step ", step, " in ", name_, " holds ", v->bytes,
                          " bytes, the state has ", state.bytes());
    return false;
  }
  if (!verify(*v, why)) return false;
  size_t off = 0;
  for (const StateSpan& s : state.spans()) {
    state.backend()->copy_from_host(s.data, v->payload + off, s.bytes());
    off += s.bytes();
  }
  // A writer that started on this slot meanwhile stored step = -1 before touching the
  // payload; seeing the same step again means the bytes we copied were the verified ones.
  std::atomic_thread_fence(std::memory_order_acquire);
  if (header()->slots[v->slot].step.load(std::memory_order_acquire) != step) {
    *why = detail::concat("slot of step ", step, " in ", name_, " was overwritten while reading");
    return false;
  }
  return true;
}

bool corrupt_snapshot_slot(const std::string& name, int64_t step, size_t offset) {
  auto r = SnapshotRegion::open_existing(name, /*writable=*/true);
  if (!r) return false;
  auto v = r->find(step);
  if (!v || v->bytes == 0) return false;
  r->payload(v->slot)[offset % v->bytes] ^= 0xFF;
  return true;
}

}  // namespace keel
