// Shared helpers of the ckpt/ tests: a small CPU TrainState with recognisable contents, a
// job name unique to the test process, and a guard that removes the job's segments.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/snapshot_region.h"
#include "model/train_state.h"
#include "runtime/backend.h"

namespace keel::test {

inline keel_param_desc param_desc(const char* name, std::vector<int64_t> shape) {
  keel_param_desc d;
  std::memset(&d, 0, sizeof(d));
  std::strncpy(d.name, name, sizeof(d.name) - 1);
  d.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  d.tp_dim = -1;
  d.tp_blocks = 1;
  d.init = KEEL_INIT_ZEROS;
  return d;
}

// Two parameters, {64, rows} and {rows}: about 25 KB of state with moments.
inline std::unique_ptr<TrainState> make_state(Backend* backend, int64_t rows = 32) {
  return std::make_unique<TrainState>(
      backend, std::vector<keel_param_desc>{param_desc("w", {64, rows}), param_desc("b", {rows})},
      0, 1, 1, false);
}

// Fills every span with a pattern keyed by `seed`.
inline void fill(TrainState& s, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (const StateSpan& span : s.spans()) {
    std::vector<float> host(span.floats);
    for (auto& f : host) {
      x = x * 1664525u + 1013904223u;
      f = static_cast<float>(x >> 8) / 65536.0f;
    }
    s.backend()->copy_from_host(span.data, host.data(), span.bytes());
  }
}

// Every byte of the state, in span order.
inline std::vector<char> dump(TrainState& s) {
  std::vector<char> out;
  for (const StateSpan& span : s.spans()) {
    size_t at = out.size();
    out.resize(at + span.bytes());
    s.backend()->copy_to_host(out.data() + at, span.data, span.bytes());
  }
  return out;
}

// A job name no other test process uses.
inline std::string unique_job() {
  static std::atomic<int> n{0};
  return "ckpttest" + std::to_string(::getpid()) + "x" + std::to_string(n++);
}

// Unlinks the job's segments when the test ends and checks /dev/shm is clean.
class JobGuard {
 public:
  JobGuard() : job_(unique_job()) {}
  ~JobGuard() {
    unlink_job_segments(job_);
    EXPECT_TRUE(job_segments(job_).empty()) << "segments of " << job_ << " left in /dev/shm";
  }
  const std::string& job() const { return job_; }

 private:
  std::string job_;
};

}  // namespace keel::test
