// A new leader's start (DESIGN.md, Control state and failover): the controller before it died
// or lost its lease; the job's ranks train on meanwhile. What this leader knows of the job
// came from etcd (the spec, the Membership it restored, the store the ranks share); what only
// the agents know (which workers run, their PIDs) comes back as each registers again.
#include <chrono>

#include "launcher/controller/controller_impl.h"
#include "launcher/controller/etcd_control_state.h"
#include "runtime/logging.h"

namespace keel {

void Controller::Impl::take_over() {
  const auto start = Clock::now();
  // An agent follows a new leader within its lease's lapse and a watch event; one that does
  // not within the slot timeout is treated as a slot that went silent.
  const auto timeout = std::chrono::milliseconds(o.cfg.detect().slot_timeout_ms());
  const int lost = host->await_rejoin(timeout);
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  LOG(WARNING) << "took over the job as its leader controller (epoch " << members.epoch()
               << ", term " << (o.state ? o.state->term() : 0)
               << "): " << members.slot_count() - lost << " slot(s) registered again in " << took
               << " s" << (lost ? detail::concat(", ", lost, " lost") : "");
  ctx.event("takeover", EventFields()
                            .add("epoch", members.epoch())
                            .add("term", o.state ? o.state->term() : int64_t(0))
                            .add("slots_back", members.slot_count() - lost)
                            .add("slots_lost", lost)
                            .add("rejoin_s", took));
}

}  // namespace keel
