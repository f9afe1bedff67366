// A Communicator decorator for fault injection: it forwards every call to the real
// communicator, except once its switch is armed:
//   hang                the next collective or point-to-point call blocks forever, before
//                       reaching the real communicator (the rank never enters it);
//   hang_in_collective  the next collective runs to completion on the real communicator and
//                       then never returns: its peers move on, and the rank's call tracing
//                       (parallel/traced_communicator.h, wrapped inside this one) is told it
//                       is still inside that collective.
// The switch is shared by the five communicators of one rank (robust/fault_injector.h), so
// "the step's first collective" is whichever of them the step calls first.
//
// A hung call deliberately ignores abort(): a stuck GPU kernel or a wedged NIC does not
// answer either. The peers then hit their communicator timeout (or the controller's hang
// rules name the rank), and the supervisor, seeing the rank not answer its abort, kills it.
// That is the path these faults exist to exercise.
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include "parallel/communicator.h"

namespace keel {

// Armed once, never disarmed: the process that hangs is killed, not healed.
class HangSwitch {
 public:
  // hang: every later call blocks before it starts.
  void arm() { armed_.store(true); }
  bool armed() const { return armed_.load(); }

  // hang_in_collective: the first collective to return after this never returns.
  void arm_after_collective() { after_.store(true); }
  // True for exactly one caller once armed: the collective that holds.
  bool claim_hold() {
    if (!after_.load()) return false;
    return !held_.exchange(true);
  }

 private:
  std::atomic<bool> armed_{false}, after_{false}, held_{false};
};

class FaultyCommunicator : public Communicator {
 public:
  // `stay_inside`, if given, runs when a hang_in_collective holds this communicator's call,
  // after the real collective returned: it makes the rank's tracing show it inside again.
  FaultyCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<HangSwitch> hang,
                     std::function<void()> stay_inside = {});

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
  std::vector<LinkStats> link_stats() const override { return inner_->link_stats(); }

  Communicator& inner() { return *inner_; }

 private:
  // Blocks forever once the switch is armed.
  void maybe_hang() const;
  // After a collective returned: blocks forever if this is the one a hang_in_collective holds.
  void maybe_hold();

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<HangSwitch> hang_;
  std::function<void()> stay_inside_;
};

}  // namespace keel
