// The keel_ops table (model/plugin.h) a plugin computes with, bound to one Backend and the
// tensor-parallel Communicator of this rank. The table is plain C; this class is the C++ side
// that owns it and turns the C boundary's status codes back into typed exceptions.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <utility>

#include "model/plugin.h"

namespace keel {

class Backend;
class Communicator;

class OpsTable {
 public:
  // `tp` is the TP group's communicator, or nullptr when tp == 1. Both must outlive the table.
  OpsTable(Backend* backend, Communicator* tp);
  ~OpsTable();
  OpsTable(const OpsTable&) = delete;
  OpsTable& operator=(const OpsTable&) = delete;

  // The table to put in keel_stage_args::ops; valid as long as this object.
  const keel_ops* ops() const { return &ops_; }

  // Called for keel_ops::grad_ready(index); without one, grad_ready does nothing.
  void set_grad_ready(std::function<void(int)> fn) { grad_ready_ = std::move(fn); }
  // Asked before every op: true once the epoch is aborted. The op then records a
  // CommAborted like a failed one, so the rest of the plugin's forward or backward does
  // nothing and the survivor answers the abort within one op instead of after its whole
  // micro-batch (seconds of a large model). The step is given up anyway: nothing it computed
  // is applied.
  void set_abort_probe(std::function<bool()> aborted) { aborted_ = std::move(aborted); }

  // No exception ever crosses the C boundary. An op that threw (a CommError from the
  // communicator, an Error from the backend) records the first such exception; communicating
  // ops then return 1 and every later op does nothing (sum returns NaN) until the failure is
  // collected here. Call this after every plugin call, not only after one that returned
  // non-zero: a backend op that failed on a stage without communication has no status to
  // return through. Rethrows the recorded exception with its type and clears the record.
  void rethrow_if_failed();
  bool failed() const { return static_cast<bool>(error_); }

 private:
  friend struct OpsThunks;
  // The cross-entropy temporaries: row_max [N], then sum_exp [N] and target_logit [N]
  // adjacent so that one all-reduce carries both.
  float* xent_buffer(size_t n_rows);

  Backend* backend_;
  Communicator* tp_;
  keel_ops ops_{};
  std::function<void(int)> grad_ready_;
  std::function<bool()> aborted_;
  std::exception_ptr error_;
  float* xent_ = nullptr;
  size_t xent_rows_ = 0;
};

}  // namespace keel
