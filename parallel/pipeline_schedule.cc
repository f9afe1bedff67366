#include "parallel/pipeline_schedule.h"

#include <algorithm>

#include "runtime/check.h"

namespace keel {

std::vector<PipelineAction> one_f_one_b(int stage, int P, int M) {
  if (M < 1) throw InputError(detail::concat("pipeline: micro-batches per step = ", M, " < 1"));
  KEEL_CHECK(stage >= 0 && stage < P, "stage ", stage, " of ", P);
  const bool first = stage == 0, last = stage == P - 1;
  const int warmup = std::min(P - stage - 1, M);
  const int steady = M - warmup;
  std::vector<PipelineAction> out;
  auto fwd = [&](int m) {
    PipelineAction a{PipelineAction::kForward, m};
    a.recv_input = !first;
    a.send_output = !last;
    return a;
  };
  auto bwd = [&](int m) {
    PipelineAction a{PipelineAction::kBackward, m};
    a.recv_grad = !last;
    a.send_grad = !first;
    return a;
  };
  int next_f = 0, next_b = 0;
  for (int i = 0; i < warmup; ++i) out.push_back(fwd(next_f++));
  for (int i = 0; i < steady; ++i) {
    // Forward's send of its output and the following backward's receive of the output
    // gradient go to and come from the same (next) stage: Megatron's
    // send_forward_recv_backward.
    PipelineAction f = fwd(next_f++);
    f.fused_with_next = f.send_output;
    out.push_back(f);
    // The backward's send of its input gradient and the next forward's receive of its input
    // both talk to the previous stage: send_backward_recv_forward.
    PipelineAction b = bwd(next_b++);
    b.fused_with_next = b.send_grad && i + 1 < steady;
    out.push_back(b);
  }
  for (int i = 0; i < warmup; ++i) out.push_back(bwd(next_b++));
  return out;
}

int max_in_flight(int stage, int P, int M) {
  return std::min(P - stage, M);
}

std::string to_string(const std::vector<PipelineAction>& actions) {
  std::string s;
  for (const auto& a : actions) {
    if (!s.empty()) s += ' ';
    s += (a.kind == PipelineAction::kForward ? 'F' : 'B') + std::to_string(a.micro_batch);
  }
  return s;
}

}  // namespace keel
