// recovery.on_no_standby = reshape (issue 30, part 2; DESIGN.md, Failure handling): which
// layout the job takes when it has lost machines, no standby is ready and shrinking data
// parallelism cannot help (DP 1, ZeRO-1, or losses in two replicas), and which it grows back
// to when machines return. Pure code: the caller says which layouts the model allows.
//
// The rules, in order:
//   - the layout fits the slots that are left: tp·pp·dp ranks on whole slots of
//     workers_per_slot ranks each (the slots it does not need become standbys);
//   - the global batch stays: micro_batch · dp divides it (each replica runs more
//     micro-batches when dp shrinks);
//   - the model allows it (heads, FFN width and vocabulary divisible by tp; pp no more than the
//     layers), as `invalid` says;
//   - never more ranks than the configured layout (the job grows back to it, not past it);
//   - among those, the most ranks; then the most model parallelism up to the configured
//     tp·pp (each rank holds 1/(tp·pp) of the model and its optimizer state: fewer ranks must
//     not make that share larger than they have to, and it need not get smaller than
//     configured); then the TP nearest the configured one, then the PP. With room for all of
//     it, that is the configured layout.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "parallel/topology.h"

namespace keel::policy {

struct ReshapeRequest {
  Topology configured{1, 1, 1};  // the job's layout as configured (the most it grows back to)
  int live_slots = 0;            // slots that can hold ranks now (running and ready standbys)
  int workers_per_slot = 1;
  int micro_batch = 1, global_batch = 1;
  // Why the model cannot be laid out as `t` ("" when it can): the caller's config checks.
  std::function<std::string(const Topology&)> invalid;
};

struct ReshapeChoice {
  Topology topo{1, 1, 1};
  int slots = 0;    // slots it occupies (the first `slots` of the live ones)
  std::string why;  // one line for the incident: what was chosen and why
};

// "TP2xPP1xDP1": how incidents and refusals name a layout.
std::string layout_label(const Topology& t);

// The layout to take, or nullopt with `*why_not` naming the rule nothing passed (e.g. "no
// layout of at most 2 ranks keeps train.global_batch_size = 16 with micro-batches of 4 and
// fits the model").
std::optional<ReshapeChoice> choose_reshape(const ReshapeRequest& r, std::string* why_not);

}  // namespace keel::policy
