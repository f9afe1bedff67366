// Background snapshot copy and backup push; see snapshotter.h.
#include "ckpt/snapshotter.h"

#include <cstdio>
#include <cstring>
#include <utility>

#include "ckpt/backup_service.h"
#include "ckpt/snapshot_region.h"
#include "model/train_state.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

Snapshotter::Snapshotter(TrainState* state, SnapshotRegion* region, SnapshotterOptions options)
    : state_(state), region_(region), options_(options) {
  KEEL_CHECK(state_ && region_ && region_->writable(), "snapshotter needs a state and a ",
             "writable region");
  KEEL_CHECK(state_->bytes() <= region_->capacity(), "state of ", state_->bytes(),
             " bytes does not fit ", region_->name());
  if (options_.state_in_slots && state_->backend()->updates_out_of_place()) {
    state_->attach_banks(this);
    in_slots_ = true;
  }
  copy_thread_ = std::thread([this] { copy_loop(); });
  push_thread_ = std::thread([this] { push_loop(); });
}

Snapshotter::~Snapshotter() {
  stop();
}

void Snapshotter::stop() {
  {
    std::lock_guard lk(mu_);
    if (stop_ && !copy_thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (copy_thread_.joinable()) copy_thread_.join();
  if (push_thread_.joinable()) push_thread_.join();
  if (in_slots_) {
    state_->detach_banks();
    in_slots_ = false;
  }
}

char* Snapshotter::bank(int i) {
  return region_->payload(i);
}

int Snapshotter::free_bank() const {
  return region_->free_slot();
}

void Snapshotter::invalidate(std::unique_lock<std::mutex>& lk, int i) {
  // A push not yet started of the slot's older step is superseded by the one to come.
  if (pending_ && pending_->slot == i) pending_.reset();
  if (pending_verified_ && pending_verified_->slot == i) pending_verified_.reset();
  cv_.wait(lk, [&] { return stop_ || inflight_slot_ != i; });
  region_->begin_write(i);
}

void Snapshotter::begin_write(int i) {
  std::unique_lock lk(mu_);
  auto t0 = Clock::now();
  invalidate(lk, i);
  stats_.wait_idle_seconds += seconds_since(t0);
}

void Snapshotter::commit(int i, int64_t step, uint64_t checksum) {
  region_->commit(i, step, state_->bytes(), checksum, state_->layout_fingerprint(),
                  region_->owner_rank());
  std::lock_guard lk(mu_);
  ++stats_.copies;
  stats_.last_committed_step = step;
  if (!holder_.empty()) pending_ = Push{i, step};
  cv_.notify_all();
}

bool Snapshotter::adopt(int64_t step, std::string* why) {
  KEEL_CHECK(in_slots_, "adopt() needs a state living in its snapshot slots");
  std::optional<SlotView> v = region_->find(step);
  if (!v) {
    *why = detail::concat("no slot of ", region_->name(), " holds step ", step);
    return false;
  }
  if (v->fingerprint != state_->layout_fingerprint() || v->bytes != state_->bytes()) {
    *why = detail::concat("slot of step ", step, " in ", region_->name(),
                          " was written for another layout");
    return false;
  }
  if (!SnapshotRegion::verify(*v, why)) {
    // Damaged where it lies: dropped, so that no survey offers its step again.
    if (v->slot != state_->live_bank()) begin_write(v->slot);
    *why += "; dropped";
    return false;
  }
  state_->adopt_bank(v->slot, step);
  forget_after(step);
  return true;
}

double Snapshotter::keep_verified(int64_t step) {
  const auto t0 = Clock::now();
  constexpr int kV = SnapshotRegion::kVerifiedSlot;
  std::optional<SlotView> v = region_->find(step);
  if (v && v->slot == kV) return 0;  // the state lives in the verified slot already (adopted)
  {
    std::unique_lock lk(mu_);
    invalidate(lk, kV);
  }
  if (!v) {  // not snapshotted yet (the job's start state): straight from the state
    KEEL_CHECK(state_->step() == step, "keep_verified: no slot of ", region_->name(),
               " holds step ", step, " and the state is at step ", state_->step());
    region_->write(*state_, step, kV, /*verified=*/true);
    push_verified(step);
    return seconds_since(t0);
  }
  std::memcpy(region_->payload(kV), v->payload, v->bytes);
  region_->commit(kV, step, v->bytes, v->checksum, v->fingerprint, v->owner_rank,
                  /*verified=*/true);
  push_verified(step);
  return seconds_since(t0);
}

void Snapshotter::push_verified(int64_t step) {
  std::lock_guard lk(mu_);
  if (holder_.empty()) return;
  pending_verified_ = Push{SnapshotRegion::kVerifiedSlot, step, true};
  cv_.notify_all();
}

void Snapshotter::forget_after(int64_t step) {
  std::unique_lock lk(mu_);
  for (int i = 0; i < SnapshotRegion::kSlots; ++i) {
    std::optional<SlotView> v = region_->slot_view(i);
    if (v && v->step > step && i != state_->live_bank()) invalidate(lk, i);
  }
}

bool Snapshotter::pinned(int slot) const {
  return inflight_slot_ == slot || (pending_ && pending_->slot == slot) ||
         (pending_verified_ && pending_verified_->slot == slot);
}

void Snapshotter::capture() {
  std::unique_lock lk(mu_);
  KEEL_CHECK(!stop_, "capture() after stop()");
  // In the slots, the update committed the snapshot already (and queued its push).
  if (in_slots_) return;
  auto t0 = Clock::now();
  cv_.wait(lk, [&] { return !capture_; });
  stats_.wait_idle_seconds += seconds_since(t0);
  capture_ = state_->step();
  cv_.notify_all();
}

void Snapshotter::wait_idle() {
  std::unique_lock lk(mu_);
  auto t0 = Clock::now();
  cv_.wait(lk, [&] { return !capture_ || stop_; });
  stats_.wait_idle_seconds += seconds_since(t0);
  if (!copy_error_.empty()) throw Error(std::exchange(copy_error_, ""));
}

void Snapshotter::wait_pushed() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] {
    return stop_ || (!capture_ && !pending_ && !pending_verified_ && inflight_slot_ < 0);
  });
}

void Snapshotter::set_backup_holder(const std::string& addr) {
  std::lock_guard lk(mu_);
  if (!addr.empty() && addr != holder_) {
    push_error_reported_ = false;  // a new holder gets its own first report
    degraded_ = false;
    // A new holder has no verified snapshot of ours yet.
    if (auto v = region_->slot_view(SnapshotRegion::kVerifiedSlot))
      pending_verified_ = Push{SnapshotRegion::kVerifiedSlot, v->step, true};
  }
  holder_ = addr;
  if (addr.empty()) pending_.reset(), pending_verified_.reset();
  cv_.notify_all();
}

SnapshotStats Snapshotter::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Snapshotter::copy_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || capture_; });
    if (stop_) return;
    const int64_t step = *capture_;
    // Slots of steps >= this one are left from before a restore to an older step; they go
    // first (once no push is reading them), so a restore never finds a stale twin.
    auto stale_pinned = [&] {
      for (int i = 0; i < SnapshotRegion::kSlots; ++i) {
        auto v = region_->slot_view(i);
        if (v && v->step >= step && pinned(i)) return true;
      }
      return false;
    };
    cv_.wait(lk, [&] { return stop_ || !stale_pinned(); });
    if (stop_) return;
    region_->invalidate_from(step);
    // Only this thread writes the region, so the free slot cannot change while we wait.
    const int slot = region_->free_slot();
    // Overwriting a slot that is being (or about to be) pushed would send a torn snapshot;
    // wait for the push, which is bounded by its timeout.
    cv_.wait(lk, [&] { return stop_ || !pinned(slot); });
    if (stop_) return;
    lk.unlock();
    auto t0 = Clock::now();
    std::string error;
    try {
      region_->write(*state_, step, slot);
    } catch (const std::exception& e) {
      error = e.what();
    }
    lk.lock();
    stats_.copy_seconds += seconds_since(t0);
    if (error.empty()) {
      ++stats_.copies;
      stats_.last_committed_step = step;
      if (!holder_.empty()) pending_ = Push{slot, step};  // supersedes an older unpushed one
    } else {
      copy_error_ = "snapshot of step " + std::to_string(step) + " failed: " + error;
    }
    capture_.reset();
    cv_.notify_all();
  }
}

void Snapshotter::push_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || pending_ || pending_verified_; });
    if (stop_) return;
    std::optional<Push>& next = pending_verified_ ? pending_verified_ : pending_;
    const Push p = *next;
    next.reset();
    const std::string addr = holder_;
    const bool degraded = degraded_;
    inflight_slot_ = p.slot;
    stats_.push_in_flight_step = p.step;
    lk.unlock();
    std::string error;
    size_t bytes = 0;
    try {
      if (!client_ || client_->address() != addr || client_degraded_ != degraded) {
        client_ = degraded ? std::make_unique<BackupClient>(addr, options_.degraded_timeout)
                           : std::make_unique<BackupClient>(addr, options_.push_timeout,
                                                            options_.connect_timeout);
        client_degraded_ = degraded;
      }
      bytes = client_->push(*region_, p.step, p.verified);
    } catch (const std::exception& e) {
      error = e.what();  // BackupClient reconnects on the next push
    }
    lk.lock();
    inflight_slot_ = -1;
    stats_.push_in_flight_step = -1;
    if (error.empty()) {
      ++stats_.pushes;
      stats_.bytes_pushed += static_cast<int64_t>(bytes);
      stats_.last_pushed_step = p.step;
      stats_.last_push_error.clear();
      push_error_reported_ = false;
      degraded_ = false;
    } else {
      ++stats_.pushes_failed;
      stats_.last_push_error = error;
      if (addr == holder_) degraded_ = true;
      if (!push_error_reported_) {
        // Once per outage: a dead holder would otherwise log every step until the rebuild.
        LOG(WARNING) << "snapshotter: backup push of step " << p.step << " failed (" << error
                     << "); snapshots stay local until a push succeeds";
        push_error_reported_ = true;
      }
    }
    cv_.notify_all();
  }
}

}  // namespace keel
