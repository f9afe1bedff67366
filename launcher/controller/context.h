// What the controller's parts share (launcher/controller/controller.h composes them): its
// options, the RankHost its ranks run on, the job's store, the one JobMembership, the way to
// handle the control plane's pending messages while a part waits, and the event log. Also
// the environment a rank (or a stand-in) starts with, and a failure as detection hands it
// to the epoch transition.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "launcher/controller/controller.h"
#include "launcher/controller/event_fields.h"
#include "launcher/controller/membership.h"
#include "launcher/controller/rank_host.h"
#include "parallel/store.h"
#include "proto/report.pb.h"
#include "robust/recovery_policy.h"

namespace keel {

using Clock = std::chrono::steady_clock;

struct ControllerContext {
  const ControllerOptions* o = nullptr;
  RankHost* host = nullptr;
  std::shared_ptr<Store> store;
  JobMembership* members = nullptr;
  // Handles the control plane's pending messages (progress, keel-ctl): called by a part that
  // waits on the ranks or its stand-ins. Empty: nothing to handle.
  std::function<void()> pump;

  void event(const std::string& kind, const EventFields& fields) const {
    if (o->on_event) o->on_event(kind, fields);
  }
  void pump_once() const {
    if (pump) pump();
  }
  const config::JobConfig& cfg() const { return o->cfg; }
  // The policy's options; `with_checkpoint` also finds the newest complete persistent
  // checkpoint (reads and verifies it: only when a failure is decided, not on every poll).
  policy::Options policy_options(bool with_checkpoint) const;
  // recovery.on_no_standby = reshape: why the job's model cannot be laid out as a layout ("" if
  // it can), from the plugin's own parameter tables.
  std::function<std::string(const Topology&)> layout_checker() const;
  mutable std::function<std::string(const Topology&)> layout_check;  // policy_options' copy
  // Captures every worker's stacks into <run_dir>/stacks/<name>/ and groups them
  // (launcher/controller/stack_report.h).
  control::StacksReply capture_stacks(const std::string& name) const;
  // The environment of `rank` of the current epoch (restarted: it replaces a dead one).
  // Start-up facts only: the layout comes with the Membership in rebuild/<E>.
  std::map<std::string, std::string> rank_env(int rank, bool restarted) const;
  // The environment of a stand-in (diagnostics, replay): `index` of `count`, no control plane.
  std::map<std::string, std::string> stand_in_env(int index, int count) const;
};

// A failure seen now. The policy's input is `failure` (the culprit and the rule live there
// only); `found` holds what detection and the ladder's mechanisms saw for the record: the
// kind as the report names it, the culprit's slot, the detail, the times, the SDC verdict's
// facts, the diagnostics. The incident is derived from both and the plan by incident_of()
// (launcher/controller/incident.h); nothing writes an outcome into `found`.
struct Detected {
  report::Incident found;
  policy::Failure failure;
};

// Stores `inc` as the job's next incident (incident/<n>, and in etcd's control state when the
// job has one); returns n.
int64_t store_incident(const ControllerContext& ctx, const report::Incident& inc);
// Its two halves in the ranks' store, for a caller that writes etcd's copy itself (an epoch
// transition, in its own transaction): the index the next incident takes, and `inc`
// recorded there and counted.
int64_t next_incident(const ControllerContext& ctx);
void count_incident(const ControllerContext& ctx, int64_t n, const report::Incident& inc);

}  // namespace keel
