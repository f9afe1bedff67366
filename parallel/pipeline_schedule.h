// The 1F1B pipeline schedule (PipeDream-Flush, as Megatron-LM runs it without interleaving):
// stage p of P runs min(P−p−1, M) warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards. At most P−p micro-batches are in flight on
// stage p, which bounds activation memory, and the bubble is (P−1)/(M+P−1) of the step.
//
// The schedule is a list of actions with the communication each one needs, so that the
// Trainer runs it literally and a unit test can check it without running a model.
#pragma once

#include <string>
#include <vector>

namespace keel {

struct PipelineAction {
  enum Kind { kForward, kBackward } kind;
  int micro_batch;
  // Communication around the compute, in Megatron's fused pairs. recv_* happen before the
  // compute, send_* after; when `fused` is set the send after this compute and the receive
  // before the next action are one send_recv call (so neighbours that exchange in opposite
  // directions never deadlock).
  bool recv_input = false;       // forward: activation from the previous stage
  bool send_output = false;      // forward: activation to the next stage
  bool recv_grad = false;        // backward: output gradient from the next stage
  bool send_grad = false;        // backward: input gradient to the previous stage
  bool fused_with_next = false;  // this action's send and the next action's recv are one call
};

// Actions of one stage for M micro-batches. Throws keel::InputError if M < 1.
std::vector<PipelineAction> one_f_one_b(int stage, int num_stages, int num_micro_batches);

// How many micro-batches are ever in flight on `stage` (activation buffers needed).
int max_in_flight(int stage, int num_stages, int num_micro_batches);

// "F0 F1 B0 F2 B1 B2" style text, for tests and logs.
std::string to_string(const std::vector<PipelineAction>& actions);

}  // namespace keel
