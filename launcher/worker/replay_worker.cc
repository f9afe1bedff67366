#include "launcher/worker/replay_worker.h"
#include "launcher/worker/store_address.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <iomanip>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/backup_placement.h"
#include "ckpt/restore.h"
#include "launcher/job_env.h"
#include "launcher/recovery_protocol.h"
#include "launcher/worker/rank_backend.h"
#include "model/data_loader.h"
#include "model/plugin_loader.h"
#include "model/trainer.h"
#include "parallel/net_address.h"
#include "parallel/process_groups.h"
#include "parallel/tcp_store.h"
#include "parallel/word_gather.h"
#include "proto/config_loader.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "robust/fault_injector.h"
#include "runtime/block_digest.h"
#include "runtime/logging.h"

namespace keel {
namespace {

// How long a replay worker waits for its task: the controller writes it before it starts
// the group's workers, so it is there at once unless the store is loaded.
constexpr std::chrono::seconds kTaskWait{30};

// The group's task (store::ReplayTask), checked.
store::ReplayTask read_task(Store& store, const std::string& key) {
  const auto t = get_message<store::ReplayTask>(store, keys::replay_task_key(key), kTaskWait);
  if (t.step() < 0 || t.epoch() < 0 || t.source_dp() < 1)
    throw InputError(detail::concat(keys::replay_task_key(key), ": step ", t.step(), ", epoch ",
                                    t.epoch(), ", source_dp ", t.source_dp(),
                                    ": step, epoch >= 0 and source_dp >= 1 expected"));
  return t;
}

// The job as it ran has its backups laid out for D = source_dp replicas. Rank x's state at
// step A, fetched as a promoted standby would (the parked workers'
// BackupServers still serve), then laid out for one replica (rank g of `topo_1`): the
// layouts differ only in the padding to a multiple of dp blocks. The controller picked A as a
// step every rank can restore from its own snapshot or its holder's, not always both: a
// holder a step behind (its snapshot of A was still being written when the job stopped)
// sends the replay to x's own server, which serves x's own snapshots.
std::unique_ptr<TrainState> fetch_state(const config::JobConfig& cfg, const store::ReplayTask& re,
                                        const std::string& key, Store& store, Backend& backend,
                                        const Plugin& plugin, int g, Millis timeout) {
  const int T = cfg.parallel().tp(), P = cfg.parallel().pp(), D = re.source_dp();
  config::JobConfig cfg_d = cfg, cfg_1 = cfg;
  cfg_d.mutable_parallel()->set_dp(D);
  cfg_1.mutable_parallel()->set_dp(1);
  const Topology topo_d(T, P, D), topo_1(T, P, 1);
  const Coord c = topo_1.coord(g);
  const int x = topo_d.rank({0, c.pp, c.tp});  // the job's rank whose state this one replays
  const BackupPlacement bp =
      backup_holder(topo_d, x, replicas_hold_backups(topo_d, cfg.parallel().zero1()));
  if (bp.holder < 0)
    throw Error(detail::concat("rank ", x, " of the job (", T * P * D,
                               " rank(s)) has no backup holder to replay from"));
  std::vector<BackupSource> servers;
  std::string unregistered;
  for (const int server : {bp.holder, x}) {
    const std::string addr_key = keys::backup_addr_key(re.epoch(), server);
    try {
      servers.push_back({get_message<store::Endpoint>(store, addr_key, timeout).address(), server});
    } catch (const CommTimeout&) {
      unregistered += detail::concat("\n  no backup server of rank ", server,
                                     " registered in epoch ", re.epoch(), " (", addr_key, ")");
    }
  }
  auto source = make_train_state(cfg_d, &backend, plugin, topo_d, x);
  try {
    const RestoreResult got = restore_state(*source, re.step(), nullptr, servers, x, timeout);
    LOG(INFO) << key << " rank " << g << ": rank " << x << "'s step " << re.step() << " from "
              << got.source;
  } catch (const RestoreError& e) {
    throw Error(e.what() + unregistered);
  }
  auto state = make_train_state(cfg_1, &backend, plugin, topo_1, g);
  const std::vector<StateSpan> from = source->spans(), to = state->spans();
  for (size_t i = 0; i < from.size(); ++i)
    backend.copy(to[i].data, from[i].data, std::min(from[i].bytes(), to[i].bytes()));
  state->set_step(re.step());
  return state;
}

// The replay itself; throws on any failure (the caller publishes it).
int replay(const WorkerOptions& o, const std::string& key, const std::shared_ptr<Store>& store,
           const std::string& store_host) {
  const store::ReplayTask re = read_task(*store, key);
  const config::JobConfig cfg = load_config(o.config_path, o.overrides);
  const int T = cfg.parallel().tp(), P = cfg.parallel().pp(), D = re.source_dp();
  if (cfg.parallel().zero1() && D > 1)
    throw InputError(detail::concat("parallel.zero1 with dp ", D,
                                    ": the moments are sharded across replicas, and one "
                                    "pipeline cannot assemble them to replay the step"));
  if (o.world_size != T * P)
    throw InputError(detail::concat("a replay group of tp", T, " pp", P, " needs ", T * P,
                                    " workers, but KEEL_WORLD_SIZE is ", o.world_size));
  // The replay: one pipeline that runs every micro-batch of the job's global batch.
  config::JobConfig cfg_1 = cfg;
  cfg_1.mutable_parallel()->set_dp(1);
  const Topology topo_1(T, P, 1);
  const int g = o.rank;
  const Coord c = topo_1.coord(g);
  const int x = Topology(T, P, D).rank({0, c.pp, c.tp});  // the job's rank it replays

  std::unique_ptr<Backend> backend = make_rank_backend(cfg, g, o.local_world_size);
  std::shared_ptr<Plugin> plugin = Plugin::load(cfg.model().plugin());
  DataLoader data = DataLoader::from_config(cfg_1);
  const Millis timeout(cfg.parallel().comm_timeout_ms());

  std::unique_ptr<TrainState> state =
      fetch_state(cfg, re, key, *store, *backend, *plugin, g, timeout);

  // The machine's defect, if the job recorded one: this is what the replay is to expose.
  FaultInjector injector(faults::FaultSchedule{}, g, store);
  const int slot = JobEnv::get().slot;
  const bool defective = slot >= 0 && injector.arm_machine_defects(slot);

  // Under the key's own prefix: no other group's rendezvous, nor the job's, can meet it.
  ProcessGroupOptions po;
  po.timeout = timeout;
  po.device = backend->kind();
  po.cuda_device = g % std::max(1, o.local_world_size);
  po.host = reachable_address(store_host);
  ProcessGroups groups = make_process_groups(
      topo_1, g, std::make_shared<PrefixStore>(keys::replay_groups_prefix(key), store), po);

  Trainer trainer(cfg_1, backend.get(), plugin, topo_1, g, state.get(), &groups, &data);
  TrainerHooks hooks;
  if (defective)
    hooks.computed = [&injector](int64_t s, TensorClass cls, float* d, size_t n, bool again) {
      injector.on_computed(s, cls, d, n, again);
    };
  trainer.set_hooks(hooks);
  const StepStats st = trainer.step();

  // Every span (a defect in the moments shows there only), every rank's, in rank order.
  const std::vector<uint64_t> mine = state->digests().spans;
  const std::vector<uint64_t> all = all_gather_words(*groups.world, mine.data(), mine.size());
  if (g == 0) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016" PRIx64,
                  block_digest(all.data(), all.size() * sizeof(uint64_t)));
    store::ReplayResult result;
    result.set_loss(st.loss);
    result.set_digest(hex);
    set_message(*store, keys::replay_result_key(key), result);
  }
  // Rank 0 has its gather before any peer's communicators go away.
  groups.world->barrier();
  LOG(INFO) << key << " rank " << g << " (job rank " << x
            << (defective ? ", defective machine" : "") << "): step " << re.step() + 1
            << " replayed, loss " << std::fixed << std::setprecision(6) << st.loss;
  return 0;
}

}  // namespace

int run_replay_worker(const WorkerOptions& o) {
  const std::string key = JobEnv::get().replay_key;
  KEEL_CHECK(!key.empty(), env::kReplay, " is not set");
  // Without the store nothing can be published: main() reports that and exits non-zero.
  const StoreAddress at = store_at(o.store_addr);
  const std::string host = at.toward_host;
  std::shared_ptr<Store> store = at.connect();
  try {
    return replay(o, key, store, host);
  } catch (const std::exception& e) {
    LOG(ERROR) << key << " rank " << o.rank << ": " << e.what();
    // The first failure is the cause; a peer's timeout on the failed rank comes later.
    try {
      if (store->add(keys::replay_errors_key(key), 1) == 1) {
        store::ReplayResult result;
        result.set_error(detail::concat(o.rank, ": ", e.what()));
        set_message(*store, keys::replay_result_key(key), result);
      }
    } catch (const std::exception& e2) {
      LOG(ERROR) << key << " rank " << o.rank << ": could not publish the error: " << e2.what();
    }
    return 1;
  }
}

}  // namespace keel
