#include "launcher/controller/context.h"

#include <cstdio>

#include "ckpt/checkpoint_reshard.h"
#include "ckpt/persistent_checkpoint.h"
#include "launcher/controller/etcd_control_state.h"
#include "launcher/controller/stack_report.h"
#include "launcher/job_env.h"
#include "model/plugin_loader.h"
#include "proto/store_keys.h"

namespace keel {
namespace {

// How long the capture of one worker's stacks may take: a few hundred threads unwind in
// tens of milliseconds; a worker that takes longer is reported without its stacks.
constexpr std::chrono::seconds kStacksCaptureTimeout{2};

}  // namespace

std::map<std::string, std::string> ControllerContext::rank_env(int rank, bool restarted) const {
  char start[32];
  std::snprintf(start, sizeof(start), "%.6f", o->job_start);
  const int world = members->world();
  std::map<std::string, std::string> env = {
      {"KEEL_RANK", std::to_string(rank)},
      {"KEEL_WORLD_SIZE", std::to_string(world)},
      {env::kStoreAddr, o->store_addr},
      {env::kJobId, o->job},
      {env::kSupervised, "1"},
      {env::kEpoch, std::to_string(members->epoch())},
      {env::kRestarted, restarted ? "1" : "0"},
      {env::kJobStart, start},
      {env::kLineage, o->lineage},
  };
  if (!o->controller_endpoint.empty()) env[env::kController] = o->controller_endpoint;
  if (!o->etcd_endpoints.empty()) env[env::kEtcd] = o->etcd_endpoints;
  // Ranks share cores: OpenMP threads that spin while waiting steal them from the rank
  // that has work (measured: a step 5-7x slower at load 9).
  if (world > 1) env["OMP_WAIT_POLICY"] = "PASSIVE";
  return env;
}

std::map<std::string, std::string> ControllerContext::stand_in_env(int index, int count) const {
  std::map<std::string, std::string> env = rank_env(index, /*restarted=*/false);
  env["KEEL_WORLD_SIZE"] = std::to_string(count);
  env.erase(env::kController);  // it reports nothing: its answer is in the store
  return env;
}

policy::Options ControllerContext::policy_options(bool with_checkpoint) const {
  policy::Options po;
  po.recovery = o->cfg.recovery();
  po.detect = o->cfg.detect();
  po.zero1 = o->cfg.parallel().zero1();
  po.micro_batch = o->cfg.train().micro_batch_size();
  po.global_batch = o->cfg.train().global_batch_size();
  po.configured = Topology(o->cfg.parallel().tp(), o->cfg.parallel().pp(), o->cfg.parallel().dp());
  if (po.recovery.on_no_standby() == config::RecoveryConfig::reshape) {
    // Loaded once: growing back asks every 200 ms.
    if (!layout_check) layout_check = layout_checker();
    po.layout_invalid = layout_check;
  }
  const auto& ck = o->cfg.checkpoint();
  if (with_checkpoint && ck.persistent_every_steps() > 0) {
    const Topology& topo = members->topo();
    CheckpointLayout l;
    l.tp = topo.tp();
    l.pp = topo.pp();
    l.dp = topo.dp();
    l.zero1 = o->cfg.parallel().zero1();
    l.lineage = o->lineage;  // never a newer checkpoint another run left in the directory
    try {
      po.persistent_step = find_resume_point(ck.dir(), l).step;
    } catch (const InputError&) {
      po.persistent_step = -1;  // none yet, or none complete
    }
  }
  return po;
}

std::function<std::string(const Topology&)> ControllerContext::layout_checker() const {
  // The plugin's own parameter tables say which layouts it allows (a third-party plugin's
  // rules as much as the GPT's). An update must fit the running state's tables, so the
  // configured plugin answers for whichever is in force. A private copy: the ranks' file
  // may be replaced meanwhile.
  std::shared_ptr<Plugin> plugin;
  std::string load_error;
  try {
    plugin = Plugin::load_copy(o->cfg.model().plugin());
  } catch (const std::exception& e) {
    load_error = e.what();
  }
  // Shared, not copied: policy_options hands a copy of this function out every 200 ms.
  auto cfg = std::make_shared<const config::JobConfig>(o->cfg);
  return [plugin, load_error, cfg](const Topology& t) -> std::string {
    if (!plugin) return "the plugin cannot be loaded to check the layout: " + load_error;
    // Fixed stages refuse another pp there too ("parallel.stage_layers has 2 entries for pp
    // = 1").
    try {
      sharded_layout(*plugin, *cfg, t);
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  };
}

control::StacksReply ControllerContext::capture_stacks(const std::string& name) const {
  const std::string root =
      o->run_dir.empty() ? "/tmp/keel-stacks-" + o->job : o->run_dir + "/stacks";
  return collect_stacks(*host, root + "/" + name, kStacksCaptureTimeout);
}

int64_t next_incident(const ControllerContext& ctx) {
  // Only the leader writes incidents while the ranks are stopped, so the index is its own.
  return ctx.store->add(keys::kIncidentCount, 0);
}

void count_incident(const ControllerContext& ctx, int64_t n, const report::Incident& inc) {
  // The record first, then the count: a controller killed between the two leaves a record
  // past the count, which the next leader counts (repair_incidents), never a counted
  // incident without its record.
  set_message(*ctx.store, keys::incident_key(n), inc);
  ctx.store->add(keys::kIncidentCount, 1);
}

int64_t store_incident(const ControllerContext& ctx, const report::Incident& inc) {
  const int64_t n = next_incident(ctx);
  if (ctx.o->state) ctx.o->state->incident(n, inc);
  count_incident(ctx, n, inc);
  return n;
}

}  // namespace keel
