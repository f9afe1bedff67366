// Fires a fault schedule (proto/faults.proto) on one rank, from keel-worker's step hooks:
//   before_step(S)           crash, exit, slow, slow_link, link_error, freeze, spin, and
//                            arming a hang or hang_in_collective for step S;
//   wrap(groups, activity)   after every (re)build of the rank's communicators;
//   on_local_metrics(S, m)   nan, on this rank's local loss before the global all-reduce;
//   on_computed(...)         sdc, on the tensors the Trainer computed (TrainerHooks::computed).
//
// Each fault fires at most once per job, although a crashed rank is restarted and replays
// its steps: a fault fires only in the process that wins `store.add("fault/<i>/fired", 1)
// == 1`, and the store (the controller's) outlives the ranks. A slow fault stays with the
// process that claimed it (a slow machine), so a restarted or replacement rank is not slow.
//
// Every firing is recorded in the store before it acts, so even a crash leaves its record:
//   inject/count = n;  inject/<i> = "<kind> <rank> <step> <unix seconds>"  (i < n)
// read_injections() reads them back for the report and the incident timeline.
#pragma once

#include <chrono>

#include <functional>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/trainer.h"
#include "parallel/process_groups.h"
#include "parallel/store.h"
#include "parallel/traced_communicator.h"
#include "proto/faults.pb.h"
#include "robust/faulty_communicator.h"

namespace keel {

struct InjectionRecord {
  std::string kind{};  // fault_kind_name(): "crash", "exit", "hang", "slow", "nan", ...
  int rank = 0;
  int64_t step = 0;
  double time = 0;  // unix time in seconds, when the fault fired
};

class FaultInjector {
 public:
  // `schedule` should have passed validate_fault_plan (robust/fault_spec.h); faults of
  // other ranks are ignored. `store` must outlive rank restarts (the job's store, not an
  // epoch's) and may be shared with other threads if it is thread-safe.
  FaultInjector(faults::FaultSchedule schedule, int rank, std::shared_ptr<Store> store);

  // At the start of step `step`: a crash SIGKILLs this process, an exit says on stderr that
  // an injected fault ends it (with its message, if any) and _exits with its code, a slow
  // fault sleeps delay_ms (at this and every later step), a slow_link delays every message
  // sent from then on, a link_error aborts the rank's communicators, a hang arms the switch
  // so the step's first communicator call blocks forever, a hang_in_collective so that the
  // step's first collective completes and then never returns; a freeze SIGSTOPs the whole
  // process (it goes on from here on SIGCONT), a spin loops forever in compute on this
  // thread, never returning. Throws keel::Error for a hang, hang_in_collective or
  // link_error when wrap() was never called.
  void before_step(int64_t step);
  // How long before_step(step) sleeps for the slow faults this process claimed (0 ms: it
  // does not): what the injector decided, which a test can check without timing a step.
  std::chrono::milliseconds slowdown(int64_t step) const;

  // What corrupt_snapshot and lose_snapshot do to this rank's snapshot before the rank
  // SIGKILLs itself (keel-worker owns the snapshot; the injector only says when).
  struct SnapshotActions {
    std::function<void()> corrupt_newest;  // flip a byte of the newest valid slot
    std::function<void()> remove;          // unlink the rank's snapshot segment
  };
  void set_snapshot_actions(SnapshotActions actions) { snapshot_ = std::move(actions); }

  // What slot_loss and partition do (keel-launch's worker provides them: the injector only
  // says when). Without them those faults are refused when they fire.
  struct SlotActions {
    std::function<void()> kill_slot;        // the slot's launcher, workers and shared memory go
    std::function<void()> cut_network;      // the slot's interface goes down
    std::function<void()> kill_controller;  // the leader controller's process is SIGKILLed
  };
  void set_slot_actions(SlotActions actions) { slot_ = std::move(actions); }

  // Faults added while the job runs (keel-ctl inject), read from the store at each step
  // (through `poll_store` when set: a client with a short deadline, for the step's path).
  void poll_runtime_faults();
  void set_poll_store(std::shared_ptr<Store> poll_store) { poll_store_ = std::move(poll_store); }

  // Replaces the rank's five communicators by FaultyCommunicators sharing this injector's
  // hang switch. Call again after every rebuild (new communicators are unwrapped).
  // `activity`: the rank's call tracing (trace_communicators() on the same groups, before
  // this), which a hang_in_collective keeps showing inside the collective it holds; without
  // it the held rank looks as if it were out of every call.
  void wrap(ProcessGroups& groups, std::shared_ptr<CommActivity> activity = nullptr);

  // For a nan fault at this step and rank: metrics[0] (this rank's local loss
  // contribution) becomes NaN, so after the global all-reduce every rank sees a NaN loss.
  void on_local_metrics(int64_t step, float* metrics);

  // For an sdc fault this process claimed (at its step, in before_step): flips one bit of one
  // computed value of `data` (a normal one, never a zero nothing computed) when `cls` is the
  // fault's target — every step and every recomputation from then on, or with `once` only
  // the first computation. `data` is host memory (the CPU backend); a GPU backend is not
  // corrupted (future work).
  void on_computed(int64_t step, TensorClass cls, float* data, size_t n, bool recompute);
  // Whether `schedule` holds an sdc fault (every rank then installs the computed hook).
  static bool has_sdc(const faults::FaultSchedule& schedule);

  // The machine (keel-launch slot) this process runs on. A defect is a machine's, not a
  // process's: a persistent (not `once`) sdc fault this process claims from then on is also
  // recorded as keys::machine_defect_key(slot) = the fault, so that a process started on
  // the same machine later (a stop-time replay worker) computes wrong the same way.
  void set_machine(int slot) { machine_ = slot; }
  // Makes this process as wrong as machine `slot`'s recorded defect (if any): on_computed
  // then flips as for a claimed persistent sdc fault, at every step. No record (its count
  // beside it, see record_machine) is a healthy machine. Returns whether a defect was armed.
  bool arm_machine_defects(int slot);
  // Records machine defect `key` (keys::machine_defect_key or keys::machine_link_defect_key,
  // the latter set by a persistent link_error fault) as `fault`; a record is found by its
  // count beside it, not by a get racing a tiny timeout.
  static void record_machine(Store& store, const std::string& key, const faults::Fault& fault);
  // Machine `slot`'s recorded sdc defect, if any.
  static std::optional<faults::Fault> machine_defect(Store& store, int slot);
  // Whether machine `slot`'s network is defective (a diagnostic run there must break its
  // links too).
  static bool machine_link_defective(Store& store, int slot);

  // The injections recorded so far, in firing order.
  static std::vector<InjectionRecord> read_injections(Store& store);

  // The switch shared by the wrapped communicators (for tests and diagnostics).
  const std::shared_ptr<HangSwitch>& hang_switch() const { return hang_; }

 private:
  // True if this process wins fault `index` (first claim in the job).
  bool claim(int index);
  void record(const faults::Fault& f, int64_t step);

  faults::FaultSchedule schedule_;
  int rank_;
  std::shared_ptr<Store> poll_store_;  // null: store_
  std::shared_ptr<Store> store_;
  std::shared_ptr<HangSwitch> hang_ = std::make_shared<HangSwitch>();
  bool wrapped_ = false;
  ProcessGroups* groups_ = nullptr;  // the groups wrap() last wrapped (link_error aborts them)
  bool broken_links_ = false;        // a persistent link_error this process claimed
  std::vector<int> slow_;            // indices of slow faults this process claimed
  struct Sdc {
    int index;
    bool flipped;
  };
  std::vector<Sdc> sdc_;  // sdc faults this process claimed
  int machine_ = -1;      // set_machine(); -1: unknown
  SnapshotActions snapshot_;
  SlotActions slot_;
  int64_t runtime_seen_ = 0;
};

}  // namespace keel
