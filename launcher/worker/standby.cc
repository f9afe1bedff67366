#include "launcher/worker/standby.h"

#include <chrono>

#include "launcher/job_env.h"
#include "launcher/processes.h"
#include "proto/store_values.pb.h"
#include "robust/fault_injector.h"
#include "robust/golden_check.h"
#include "robust/self_check.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {

StandbyIdentity standby_identity(const std::string& listen_host) {
  const JobEnv& env = JobEnv::get();
  StandbyIdentity id;
  id.slot = env.slot;
  id.index = env.standby_index;
  id.gen = env.standby_gen;
  id.group_rank = env.standby_group_rank;
  id.group_size = env.standby_group_size;
  if (!env.standby_group.empty()) id.group = env.standby_group;
  id.host = listen_host;
  return id;
}

StandbyAssignment park_as_standby(Backend& backend, Precision precision,
                                  const std::function<std::shared_ptr<Store>()>& connect,
                                  const StandbyIdentity& id, const TrainerHooks& golden_hooks,
                                  const std::function<void()>& warm_up) {
  // Named apart while parked (ps, and a memory watch: a promoted standby grows to a rank's
  // size, which is no leak); keel-worker again once it takes a rank.
  set_process_name("keel-standby");
  std::shared_ptr<Store> store = connect();
  const SelfCheckResult gemm = gemm_self_check(backend, precision);
  std::unique_ptr<Backend> one_thread;
  if (backend.kind() == DeviceKind::kCpu) one_thread = make_cpu_backend(1);
  const GoldenCheckResult golden =
      golden_check(one_thread ? *one_thread : backend, golden_hooks, std::nullopt, precision);
  one_thread.reset();
  const SelfCheckResult coll = collective_self_check(
      connect(), id.group, id.group_rank, id.group_size, id.host, kStandbyCollectiveTimeout,
      id.slot >= 0 && FaultInjector::machine_link_defective(*store, id.slot));
  store::StandbyCheck check;
  check.set_ok(gemm.ok && golden.ok && coll.ok);
  check.set_machine_ok(gemm.ok && golden.ok);
  if (check.ok() && warm_up) warm_up();
  check.set_checks(gemm.message + "; " + golden.message + "; " + coll.message);
  set_message(*store, keys::standby_ready_key(id.slot, id.index, id.gen), check);
  if (!check.ok())
    throw Error(detail::concat("standby ", id.index, " of slot ", id.slot,
                               " failed its self-check: ", check.checks()));
  // Parked: a promotion may come hours later, or never (the job ends and the agent stops us).
  while (true) {
    try {
      const auto v = get_message<store::StandbyAssign>(
          *store, keys::standby_assign_key(id.slot, id.index, id.gen), kParkWait);
      StandbyAssignment a;
      a.rank = v.rank();
      a.epoch = v.epoch();
      a.membership = v.membership();
      LOG(INFO) << "standby " << id.index << " of slot " << id.slot << " promoted to rank "
                << a.rank << " (epoch " << a.epoch << ")";
      set_process_name("keel-worker");
      return a;
    } catch (const CommTimeout&) {
    }
  }
}

}  // namespace keel
