// A Communicator decorator for fault injection: it forwards every call to the real
// communicator, except that once its hang switch is armed the next collective or
// point-to-point call blocks forever. The switch is shared by the five communicators of one
// rank (robust/fault_injector.h), so "the step's first collective" is whichever of them the
// step calls first.
//
// A hung call deliberately ignores abort(): a stuck GPU kernel or a wedged NIC does not
// answer either. The peers then hit their communicator timeout, and the supervisor, seeing
// the rank not answer its abort, kills it. That is the path this fault exists to exercise.
#pragma once

#include <atomic>
#include <memory>

#include "parallel/communicator.h"

namespace keel {

// Armed once, never disarmed: the process that hangs is killed, not healed.
class HangSwitch {
 public:
  void arm() { armed_.store(true); }
  bool armed() const { return armed_.load(); }

 private:
  std::atomic<bool> armed_{false};
};

class FaultyCommunicator : public Communicator {
 public:
  FaultyCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<HangSwitch> hang);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  Millis default_timeout() const override { return inner_->default_timeout(); }

  void all_reduce(float* buf, size_t n, ReduceOp op = ReduceOp::kSum,
                  Millis timeout = Millis(0)) override;
  void reduce_scatter(float* buf, size_t chunk, Millis timeout = Millis(0)) override;
  void all_gather(float* buf, size_t chunk, Millis timeout = Millis(0)) override;
  void broadcast(void* buf, size_t bytes, int root, Millis timeout = Millis(0)) override;
  void send(const void* buf, size_t bytes, int peer, uint32_t tag,
            Millis timeout = Millis(0)) override;
  void recv(void* buf, size_t bytes, int peer, uint32_t tag, Millis timeout = Millis(0)) override;
  void send_recv(const void* send_buf, size_t send_bytes, int send_peer, void* recv_buf,
                 size_t recv_bytes, int recv_peer, uint32_t tag,
                 Millis timeout = Millis(0)) override;
  void barrier(Millis timeout = Millis(0)) override;

  // Forwarded; abort() does not wake a call that hangs here.
  void abort() override { inner_->abort(); }
  bool aborted() const override { return inner_->aborted(); }
  CommStats stats() const override { return inner_->stats(); }

  Communicator& inner() { return *inner_; }

 private:
  // Blocks forever once the switch is armed.
  void maybe_hang() const;

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<HangSwitch> hang_;
};

}  // namespace keel
