#include "launcher/worker/standby.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "robust/fault_injector.h"
#include "robust/golden_check.h"
#include "robust/self_check.h"
#include "runtime/check.h"
#include "runtime/logging.h"

namespace keel {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

}  // namespace

StandbyIdentity standby_identity(const std::string& listen_host) {
  StandbyIdentity id;
  id.slot = env_int("KEEL_SLOT", -1);
  id.index = env_int("KEEL_STANDBY_INDEX", 0);
  id.gen = env_int("KEEL_STANDBY_GEN", 0);
  id.group_rank = env_int("KEEL_STANDBY_GROUP_RANK", 0);
  id.group_size = env_int("KEEL_STANDBY_GROUP_SIZE", 1);
  const char* g = std::getenv("KEEL_STANDBY_GROUP");
  id.group = g ? g : "standby/check";
  id.host = listen_host;
  return id;
}

StandbyAssignment park_as_standby(Backend& backend, std::shared_ptr<Plugin> plugin,
                                  Precision precision,
                                  const std::function<std::shared_ptr<Store>()>& connect,
                                  const StandbyIdentity& id, const TrainerHooks& golden_hooks) {
  std::shared_ptr<Store> store = connect();
  const SelfCheckResult gemm = gemm_self_check(backend, precision);
  std::unique_ptr<Backend> one_thread;
  if (backend.kind() == DeviceKind::kCpu) one_thread = make_cpu_backend(1);
  const GoldenCheckResult golden = golden_check(
      one_thread ? *one_thread : backend, std::move(plugin), golden_hooks, std::nullopt, precision);
  one_thread.reset();
  const SelfCheckResult coll = collective_self_check(
      connect(), id.group, id.group_rank, id.group_size, id.host, std::chrono::seconds(30),
      id.slot >= 0 && FaultInjector::machine_link_defective(*store, id.slot));
  const bool ok = gemm.ok && golden.ok && coll.ok;
  const std::string checks = gemm.message + "; " + golden.message + "; " + coll.message;
  store->set(keys::standby_ready_key(id.slot, id.index, id.gen), (ok ? "ok " : "failed ") + checks);
  if (!ok)
    throw Error(detail::concat("standby ", id.index, " of slot ", id.slot,
                               " failed its self-check: ", checks));
  // Parked: a promotion may come hours later, or never (the job ends and the agent stops us).
  while (true) {
    try {
      const std::string v =
          store->get(keys::standby_assign_key(id.slot, id.index, id.gen), std::chrono::hours(1));
      StandbyAssignment a;
      if (std::sscanf(v.c_str(), "%d %d %d", &a.rank, &a.epoch, &a.world) != 3)
        throw Error("standby: bad assignment '" + v + "'");
      LOG(INFO) << "standby " << id.index << " of slot " << id.slot << " promoted to rank "
                << a.rank << " (epoch " << a.epoch << ")";
      return a;
    } catch (const CommTimeout&) {
    }
  }
}

}  // namespace keel
