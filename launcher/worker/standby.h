// A warm standby worker (keel-launch --standby): it starts like any worker (backend, plugin,
// data), checks itself (robust/self_check.h: GEMM and all-reduce; robust/golden_check.h: the
// golden mini-GPT, bitwise against the repo's digest, whatever model the job trains), says so
// in the job's store, and parks
// until the controller promotes it to a rank that a lost or evicted slot vacated. Then it joins
// that rank's epoch like a restarted rank and restores its state from the backup holder.
//
// Store keys (proto/store_keys.h; the controller's side is launcher/controller/agent_host.cc):
//   standby/ready/<slot>/<index>/<gen>   store::StandbyCheck: ok, and what was checked or why
//                                        it failed
//   standby/assign/<slot>/<index>/<gen>  store::StandbyAssign: the promotion, with the
//                                        Membership of the epoch it joins
// <gen> counts the times a slot was made a standby, so a slot that comes back never reads
// the keys of its earlier life.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "model/trainer.h"
#include "parallel/store.h"
#include "proto/membership.pb.h"
#include "proto/store_keys.h"
#include "runtime/backend.h"

namespace keel {

struct StandbyIdentity {
  int slot = -1, index = 0;            // KEEL_SLOT, KEEL_STANDBY_INDEX
  int gen = 0;                         // KEEL_STANDBY_GEN: times the slot became a standby
  int group_rank = 0, group_size = 1;  // among the standbys checked together
  std::string group = keys::kStandbyCheckGroup;  // KEEL_STANDBY_GROUP: names their all-reduce
  std::string host = "127.0.0.1";                // address to listen on for it
};
// The process's identity as a standby (launcher/job_env.h), listening on `listen_host`.
StandbyIdentity standby_identity(const std::string& listen_host);

struct StandbyAssignment {
  int rank = -1;
  int epoch = 0;
  membership::Membership membership;  // the layout of the epoch it joins
  // The job's ranks now (its data parallelism may have shrunk since the standby parked).
  int world() const { return membership.tp() * membership.pp() * membership.dp(); }
};

// How long the standbys' collective self-check waits for its peers.
inline constexpr std::chrono::seconds kStandbyCollectiveTimeout{30};
// How long a parked standby waits in one store call for its promotion before it asks again:
// a promotion may come hours later, or never.
inline constexpr std::chrono::hours kParkWait{1};

// Runs the self-checks, publishes the result and waits for a promotion. A standby that
// fails its checks throws keel::Error (the worker exits; the slot is not used). The golden
// check trains keel's own GPT (golden_plugin(), not the job's plugin: it tests the machine, so
// a standby for any model is ready) on `backend` (`precision`: its GEMM precision, which picks
// the repo digest), or on CPU on a one-thread backend of its own, whose result does not depend
// on the machine's core count. A key the repo has no digest for passes, and the message says
// so. `golden_hooks` reach the golden run (a machine's injected defect: robust/fault_injector.h).
// `warm_up` runs once the checks pass, before the standby says it is ready: what the caller
// prepares for a promotion (the worker rehearses a rank's allocations).
StandbyAssignment park_as_standby(Backend& backend, Precision precision,
                                  const std::function<std::shared_ptr<Store>()>& connect,
                                  const StandbyIdentity& id, const TrainerHooks& golden_hooks = {},
                                  const std::function<void()>& warm_up = {});

}  // namespace keel
