#include "parallel/grad_sync.h"

#include <algorithm>

namespace keel {

GradSync::GradSync(Communicator* dp, float* grads, size_t padded_numel,
                   std::vector<GradSegment> segments, size_t bucket_bytes, bool zero1)
    : dp_(dp), grads_(grads), padded_(padded_numel), segs_(std::move(segments)), zero1_(zero1) {
  KEEL_CHECK(padded_ % size_t(dp_->size()) == 0, "flat buffer of ", padded_,
             " floats does not split over dp = ", dp_->size());
  bucket_of_.assign(segs_.size(), -1);
  if (zero1_ || dp_->size() == 1) return;
  // Buckets from the last parameter backwards; a bucket is a contiguous range of the buffer
  // because parameters are laid out in describe order. Deferred parameters get none.
  const size_t bucket_floats = std::max<size_t>(1, bucket_bytes / sizeof(float));
  Bucket cur{0, 0, {}};
  size_t end = 0;
  auto close = [&] {
    if (cur.params.empty()) return;
    cur.pending = int(cur.params.size());
    for (int p : cur.params) bucket_of_[p] = int(buckets_.size());
    buckets_.push_back(cur);
    cur = Bucket{0, 0, {}};
  };
  for (int i = int(segs_.size()) - 1; i >= 0; --i) {
    const GradSegment& s = segs_[i];
    if (s.deferred || s.numel == 0) {
      close();
      continue;
    }
    if (cur.params.empty()) end = s.offset + s.numel;
    cur.offset =
        s.offset;  // alignment gaps between parameters are zeros; reducing them is harmless
    cur.numel = end - s.offset;
    cur.params.push_back(i);
    if (cur.numel >= bucket_floats) close();
  }
  close();
  worker_ = std::thread([this] { worker_loop(); });
}

GradSync::~GradSync() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void GradSync::arm() {
  for (auto& b : buckets_) {
    b.pending = int(b.params.size());
    b.launched = false;
  }
  armed_ = true;
}

void GradSync::mark_ready(int index) {
  if (!armed_ || index < 0 || index >= int(bucket_of_.size())) return;
  int b = bucket_of_[index];
  if (b < 0) return;
  if (--buckets_[b].pending == 0) launch(b);
}

void GradSync::launch(int b) {
  buckets_[b].launched = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(b);
    ++in_flight_;
  }
  cv_.notify_all();
}

void GradSync::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    int b = queue_.front();
    queue_.pop_front();
    bool skip = error_ != nullptr;
    lock.unlock();
    std::exception_ptr err;
    if (!skip) {
      try {
        dp_->all_reduce(grads_ + buckets_[b].offset, buckets_[b].numel, ReduceOp::kSum);
      } catch (...) {
        err = std::current_exception();
      }
    }
    lock.lock();
    if (err && !error_) error_ = err;
    --in_flight_;
    cv_.notify_all();
  }
}

void GradSync::finish() {
  armed_ = false;
  if (dp_->size() == 1) return;
  if (zero1_) {
    dp_->reduce_scatter(grads_, shard_numel());
    return;
  }
  for (int b = 0; b < int(buckets_.size()); ++b)
    if (!buckets_[b].launched) launch(b);
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return in_flight_ == 0; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }
  // Deferred parameters last, on this thread.
  for (const auto& s : segs_)
    if (s.deferred && s.numel > 0) dp_->all_reduce(grads_ + s.offset, s.numel, ReduceOp::kSum);
}

void GradSync::all_gather_params(float* params) {
  if (dp_->size() > 1) dp_->all_gather(params, shard_numel());
}

}  // namespace keel
