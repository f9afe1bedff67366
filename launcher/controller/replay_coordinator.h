// The stop-time dual-phase replay, the controller's part (robust/sdc_replay.h decides the
// groups and reads the results): with every training worker parked in the recovery wait
// (their backup servers still serve their snapshots), each group of machines runs one whole
// TP×PP pipeline of fresh replay workers (launcher/worker/replay_worker.h) that load the same
// step, train one step and publish a digest; contiguous groups first, then strided. Each
// group's task is a store::ReplayTask under keys::replay_key(incident, phase, group), the
// key its workers get in KEEL_REPLAY; the group answers store::ReplayResult.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launcher/controller/context.h"
#include "proto/store_values.pb.h"
#include "robust/sdc_replay.h"

namespace keel {

class ReplayCoordinator {
 public:
  // The rule of the failure keel-ctl replay asks for.
  static constexpr const char* kRequestedRule = "sdc_replay_requested";

  explicit ReplayCoordinator(const ControllerContext& ctx) : ctx_(ctx) {}

  // Whether the job can replay now (sdc.replay on, whole moments at data parallelism 1,
  // machines for three groups among the active slots and ready standbys).
  bool possible(std::string* why) const;
  // Replays the step after `step` from snapshot `step` on groups of machines, contiguous
  // then strided, for the job's incident number `incident`; returns the machines in a
  // failing group of both (empty: none) and says how it went in *detail.
  std::vector<int> replay(int64_t step, int incident, std::string* detail);
  // An SDC failure without a named rank: the replay may name one (a rank of the machine).
  // A replay keel-ctl asked for that names none sets Failure::replay_cleared.
  void pin(Detected* d, const std::map<int, policy::Holdings>& have, int incident);
  // The failure keel-ctl replay asks for (an SDC suspicion with no rank named).
  Detected requested() const;

  // keel-ctl replay: asked for, served by the controller's loop.
  void request() { requested_ = true; }
  bool take_request() { return std::exchange(requested_, false); }

 private:
  // The machines a replay may use now: active slots with ranks and ready standbys.
  std::vector<int> replay_machines() const;
  // The replay's groups on them (why_not set when there are too few).
  sdc::ReplayPlan plan_now() const;
  // Phase `phase` (0 contiguous, 1 strided): starts a pipeline of `ranks` replay workers
  // (`per_slot` a machine) on each group, waits up to sdc.replay_timeout_ms for the groups'
  // answers and stops the workers; each group's digest ("": an error or no answer).
  std::vector<std::string> run_phase(int phase, const std::vector<std::vector<int>>& groups,
                                     const store::ReplayTask& task, int incident, int ranks,
                                     int per_slot);

  const ControllerContext& ctx_;
  bool requested_ = false;
};

}  // namespace keel
