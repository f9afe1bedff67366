// Data-parallel gradient reduction over one flat gradient buffer.
//
// Plain mode: the buffer is cut into buckets of about `bucket_bytes`, formed from the last
// parameter backwards (the order backward produces them, as PyTorch DDP does). During the
// last micro-batch's backward the plugin reports each parameter's gradient as final
// (keel_ops::grad_ready); when every parameter of a bucket is final its all-reduce starts on
// a background thread while backward goes on. finish() reduces what is left and waits.
//
// ZeRO-1 mode: finish() reduce-scatters the whole (padded) buffer, so each DP rank ends with
// the summed gradient of its shard only; the optimizer updates that shard and
// all_gather_params() shares the result.
//
// Parameters marked `deferred` (the tied embedding, whose gradient is first summed over the
// embedding group) are never started early. Sums only: the loss is already scaled by
// 1/(global tokens), so a sum over replicas is the mean over the global batch.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel/communicator.h"

namespace keel {

struct GradSegment {
  size_t offset = 0, numel = 0;  // in floats, within the flat buffer
  bool deferred = false;
};

class GradSync {
 public:
  // grads holds padded_numel floats, a multiple of dp->size(); segments in describe order.
  GradSync(Communicator* dp, float* grads, size_t padded_numel, std::vector<GradSegment> segments,
           size_t bucket_bytes, bool zero1);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Arms the buckets for the step's last micro-batch; mark_ready before this is ignored.
  void arm();
  // Parameter `index`'s gradient is final. Thread: the plugin's (the Trainer's) thread.
  void mark_ready(int index);
  // Reduces everything not yet reduced and waits. Rethrows a CommError from the background
  // thread.
  void finish();

  // ZeRO-1: this rank's shard of the flat buffer, [shard_begin, shard_begin + shard_numel).
  size_t shard_begin() const { return shard_numel() * size_t(dp_->rank()); }
  size_t shard_numel() const { return padded_ / size_t(dp_->size()); }
  // ZeRO-1: all-gathers `params` (same flat layout as the gradients) after the update.
  void all_gather_params(float* params);

  int num_buckets() const { return int(buckets_.size()); }

 private:
  struct Bucket {
    size_t offset, numel;
    std::vector<int> params;
    int pending = 0;
    bool launched = false;
  };
  void launch(int bucket);
  void worker_loop();

  Communicator* dp_;
  float* grads_;
  size_t padded_;
  std::vector<GradSegment> segs_;
  bool zero1_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // param index -> bucket, -1 if deferred
  bool armed_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  int in_flight_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace keel
