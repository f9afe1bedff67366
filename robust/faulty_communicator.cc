#include "robust/faulty_communicator.h"

#include <chrono>
#include <thread>

namespace keel {

FaultyCommunicator::FaultyCommunicator(std::unique_ptr<Communicator> inner,
                                       std::shared_ptr<HangSwitch> hang,
                                       std::function<void()> stay_inside)
    : inner_(std::move(inner)), hang_(std::move(hang)), stay_inside_(std::move(stay_inside)) {
  KEEL_CHECK(inner_ != nullptr);
  KEEL_CHECK(hang_ != nullptr);
}

void FaultyCommunicator::maybe_hang() const {
  if (!hang_->armed()) return;
  // Sleep rather than wait on anything abort() could signal: the point is a rank that no
  // longer answers, so that its peers' timeouts and the supervisor's kill are exercised.
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void FaultyCommunicator::maybe_hold() {
  if (!hang_->claim_hold()) return;
  // The collective completed for everyone; this rank now looks as if it never came out.
  if (stay_inside_) stay_inside_();
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void FaultyCommunicator::all_reduce(float* buf, size_t n, ReduceOp op, Millis timeout) {
  maybe_hang();
  inner_->all_reduce(buf, n, op, timeout);
  maybe_hold();
}

void FaultyCommunicator::reduce_scatter(float* buf, size_t chunk, Millis timeout) {
  maybe_hang();
  inner_->reduce_scatter(buf, chunk, timeout);
  maybe_hold();
}

void FaultyCommunicator::all_gather(float* buf, size_t chunk, Millis timeout) {
  maybe_hang();
  inner_->all_gather(buf, chunk, timeout);
  maybe_hold();
}

void FaultyCommunicator::broadcast(void* buf, size_t bytes, int root, Millis timeout) {
  maybe_hang();
  inner_->broadcast(buf, bytes, root, timeout);
  maybe_hold();
}

void FaultyCommunicator::send(const void* buf, size_t bytes, int peer, uint32_t tag,
                              Millis timeout) {
  maybe_hang();
  inner_->send(buf, bytes, peer, tag, timeout);
}

void FaultyCommunicator::recv(void* buf, size_t bytes, int peer, uint32_t tag, Millis timeout) {
  maybe_hang();
  inner_->recv(buf, bytes, peer, tag, timeout);
}

void FaultyCommunicator::send_recv(const void* send_buf, size_t send_bytes, int send_peer,
                                   void* recv_buf, size_t recv_bytes, int recv_peer, uint32_t tag,
                                   Millis timeout) {
  maybe_hang();
  inner_->send_recv(send_buf, send_bytes, send_peer, recv_buf, recv_bytes, recv_peer, tag, timeout);
}

void FaultyCommunicator::barrier(Millis timeout) {
  maybe_hang();
  inner_->barrier(timeout);
  maybe_hold();
}

}  // namespace keel
