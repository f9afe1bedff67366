// The step loop's side of hot updates (the watcher is update_watcher.h): the check of a plan
// against this rank's state, the switch before the decided step, the probation after it, and
// the plugin an epoch or a restarted process starts with.
#include "launcher/worker/worker_impl.h"
#include "model/job_layout.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/logging.h"

namespace keel::worker_detail {

// Runs on the watcher's thread: it loads a private copy and compares its parameter table with
// the running state's; nothing of the rank changes.
UpdateWatcher::Check Worker::update_check() {
  return [this](const report::Update& plan, int rank) {
    std::shared_ptr<Plugin> next = Plugin::load_copy(plan.plugin());
    if (next->hash() != plan.hash())
      throw InputError(detail::concat(plan.plugin(), " on rank ", rank, "'s machine is build ",
                                      next->hash(), ", the controller's is ", plan.hash()));
    std::vector<keel_param_desc> running;
    for (const ParamSlot& p : state_->params().slots()) running.push_back(p.desc);
    const std::string diff = first_param_difference(
        running, next->describe(model_dims(cfg_), stage_of(cfg_, members_.topo().coord(rank))));
    if (!diff.empty())
      throw InputError(detail::concat("plugin ", plan.plugin(), " (", next->name(), " ",
                                      next->version(), ") does not fit the running state: ", diff));
    return next;
  };
}

void Worker::update_before_step(int64_t s) {
  const std::optional<UpdateWatcher::Due> due = updates_->take_due(s);
  if (!due) return;
  trainer_->replace_plugin(due->plugin);  // checked when the plan came: same state, same table
  plugin_ = due->plugin;
  probation_->start(s);
  store::Step applied;
  applied.set_step(s);
  set_message(*store_, keys::update_applied_key(due->id, o_.rank), applied);
  if (leader_ && !o_.quiet) {
    std::printf("keel: plugin %s %s (%s, build %s) from step %lld\n", plugin_->name().c_str(),
                plugin_->version().c_str(), plugin_->path().c_str(), plugin_->hash().c_str(),
                static_cast<long long>(s + 1));
    std::fflush(stdout);
  }
}

void Worker::update_after_step(const StepStats& st) {
  const std::optional<std::string> why = probation_->after_step(st.step, st.loss);
  if (!why) return;
  // Every rank sees the same global loss: every rank fails here alike.
  if (recovery_) {
    store::UpdateFailure f;
    f.set_why(*why);
    set_message(*store_, keys::update_failure_key(epoch()), f);
  }
  throw UpdateProbationFailed(*why);
}

void Worker::adopt_plugin(const std::string& path, const std::string& hash) {
  if (path.empty() || hash == plugin_->hash()) return;
  probation_->end();  // a rollback, or a lazy update: judged again only when applied
  std::shared_ptr<Plugin> next = Plugin::load_copy(path);
  if (next->hash() != hash)
    throw Error(detail::concat("the job runs plugin build ", hash, " of ", path,
                               ", but this machine's copy is build ", next->hash()));
  if (trainer_) trainer_->replace_plugin(next);
  plugin_ = next;
  LOG(INFO) << "rank " << o_.rank << ": plugin " << plugin_->name() << " " << plugin_->version()
            << " (build " << plugin_->hash() << ")";
}

void Worker::adopt_current_plugin() {
  // Never updated: the config's plugin.
  if (auto p = try_get_message<store::Plugin>(*store_, keys::kPluginCurrent))
    adopt_plugin(p->path(), p->hash());
}

}  // namespace keel::worker_detail
