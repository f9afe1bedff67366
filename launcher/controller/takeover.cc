// A new leader's start (DESIGN.md, Control state and failover): the controller before it died
// or lost its lease; the job's ranks train on meanwhile. What this leader knows of the job
// came from etcd (the spec, the Membership it restored, the store the ranks share); what only
// the agents know (which workers run, their PIDs) comes back as each registers again.
#include <chrono>

#include "launcher/controller/controller_impl.h"
#include "launcher/controller/etcd_control_state.h"
#include "launcher/recovery_protocol.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
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
  repair_incidents();
}

void Controller::Impl::repair_incidents() {
  // A record past the count: the controller before this one wrote it and died before it
  // counted it (store_incident writes the record first).
  int64_t n = store->add(keys::kIncidentCount, 0);
  while (try_get_message<report::Incident>(*store, keys::incident_key(n)) ||
         (o.state && o.state->incident_record(n))) {
    n = store->add(keys::kIncidentCount, 1);
    LOG(WARNING) << "incident " << n << " was recorded but not counted: counted now";
  }
  // Counted but missing from the ranks' store: etcd has it (written in the epoch's own
  // transaction, see write_rebuild), or it is lost with the controller that handled it.
  for (int64_t i = 0; i < n; ++i) {
    if (try_get_message<report::Incident>(*store, keys::incident_key(i))) continue;
    std::optional<report::Incident> inc = o.state ? o.state->incident_record(i) : std::nullopt;
    if (!inc) {
      inc.emplace();
      inc->set_kind("unrecorded");
      inc->set_rank(-1);
      inc->set_slot(-1);
      inc->set_epoch(members.epoch());
      inc->set_detail(
          "the controller that handled this incident died before it recorded what happened");
      if (o.state) o.state->incident(i, *inc);
    }
    set_message(*store, keys::incident_key(i), *inc);
    LOG(WARNING) << "incident " << i + 1 << " had no record in the ranks' store: "
                 << (inc->kind() == "unrecorded" ? "recorded as lost" : "copied from etcd");
  }
  // An epoch in force without an incident had none (growing back, a replay that cleared every
  // machine): etcd records an epoch and its incident in one transaction.
}

std::optional<Detected> Controller::Impl::interrupted_transition() {
  // Decided and written to etcd, but not told to the ranks (they wait for its rebuild): this
  // leader tells them what the one before decided.
  const int epoch = members.epoch();
  if (o.state && !store->try_get(keys::rebuild_key(epoch))) {
    const membership::Rebuild& rb = transition;
    if (rb.has_membership() && rb.membership().epoch() == epoch) {
      set_message(*store, keys::rebuild_key(epoch), rb);
      LOG(WARNING) << "the controller before this one decided epoch " << epoch
                   << " but did not tell the ranks: this leader tells them";
      ctx.event("transition_completed", EventFields()
                                            .add("epoch", epoch)
                                            .add("rule", "interrupted_transition")
                                            .add("restore_step", double(rb.restore_step())));
      return std::nullopt;
    }
  }
  const int next = epoch + 1;
  const std::optional<store::Abort> abort =
      try_get_message<store::Abort>(*store, keys::abort_key(next));
  if (!abort || store->try_get(keys::rebuild_key(next))) return std::nullopt;
  Detected d;
  d.found.set_detected_at(recovery::unix_now());
  d.found.set_slot(-1);
  d.found.set_kind("comm_error");
  // Said once: a transition left by several leaders in a row keeps its first reason.
  const std::string left = detail::concat(" (the transition to epoch ", next,
                                          ", left unfinished by the controller before this one)");
  d.found.set_detail(abort->reason().find(left) == std::string::npos ? abort->reason() + left
                                                                     : abort->reason());
  // The ranks aborted already: what is left is the decision, taken again from the acks (a
  // rank that does not ack in time is hung, as in any transition).
  d.failure.kind = policy::FailureKind::kCommError;
  d.failure.rule = "interrupted_transition";
  LOG(WARNING) << "the controller before this one began the transition to epoch " << next
               << " and did not finish it: this leader completes it";
  return d;
}

}  // namespace keel
