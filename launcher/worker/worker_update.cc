// A rank's part in hot updates of the model's plugin (keel-ctl update; the controller's part
// is launcher/controller/controller_update.cc). A thread follows the controller's plans in the store:
// for each, it loads a private copy of the new plugin and checks it against the running
// state (so a plugin that does not fit is refused before anyone switches), reports, and
// waits for the controller's decision: the step before which every rank switches. The step
// loop then swaps the plugin between two steps; nothing else changes.
#include "launcher/worker/worker_impl.h"
#include "robust/update_probation.h"
#include "runtime/logging.h"

namespace keel::worker_detail {

void Worker::update_watch() {
  if (!env_.supervised || update_thread_.joinable()) return;
  update_thread_ = std::thread([this] {
    try {
      std::shared_ptr<Store> s = connect_();
      // Updates asked before this process started are in the plugin it adopted.
      int64_t n = s->add(keys::kUpdateCount, 0);
      while (!update_stop_) {
        report::Update plan;
        try {
          plan.ParseFromString(s->get(keys::update_key(n), std::chrono::milliseconds(200)));
        } catch (const CommTimeout&) {
          continue;
        }
        if (plan.outcome() == "refused") {  // the controller refused it: nothing to check
          ++n;
          continue;
        }
        const int rank = o_.rank;
        std::string verdict = "ok";
        std::shared_ptr<Plugin> next;
        try {
          next = Plugin::load_copy(plan.plugin());
          if (next->hash() != plan.hash())
            throw InputError(detail::concat(plan.plugin(), " on rank ", rank,
                                            "'s machine is build ", next->hash(),
                                            ", the controller's is ", plan.hash()));
          std::vector<keel_param_desc> running;
          for (const ParamSlot& p : state_->params().slots()) running.push_back(p.desc);
          const std::string diff = first_param_difference(
              running, next->describe(model_dims(cfg_), stage_of(cfg_, topo_.coord(rank))));
          if (!diff.empty())
            throw InputError(detail::concat("plugin ", plan.plugin(), " (", next->name(), " ",
                                            next->version(),
                                            ") does not fit the running state: ", diff));
        } catch (const std::exception& e) {
          verdict = detail::concat("refused: rank ", rank, ": ", e.what());
          next.reset();
        }
        s->set(keys::update_check_key(n, rank), verdict);
        std::string decision;
        while (!update_stop_ && decision.empty()) {
          try {
            decision = s->get(keys::update_apply_key(n), std::chrono::milliseconds(200));
          } catch (const CommTimeout&) {
          }
        }
        if (next && decision.rfind("step ", 0) == 0) {
          std::lock_guard<std::mutex> l(update_mu_);
          update_next_ = std::move(next);
          update_id_ = n;
          update_step_ = std::stoll(decision.substr(5));
        }
        ++n;
      }
    } catch (const std::exception& e) {
      // The store is the controller's: losing it ends the job anyway.
      LOG(ERROR) << "rank " << o_.rank << ": update watcher: " << e.what();
    }
  });
}

void Worker::update_before_step(int64_t s) {
  const int64_t at = update_step_;
  // A rank that got the decision late (it was restoring) switches at once: the controller
  // chose a step ahead of every rank's progress, so this is only ever the same step.
  if (at < 0 || s < at) return;
  std::shared_ptr<Plugin> next;
  int64_t id;
  {
    std::lock_guard<std::mutex> l(update_mu_);
    next = std::move(update_next_);
    id = update_id_;
    update_step_ = -1;
  }
  if (!next) return;
  trainer_->replace_plugin(next);  // checked when the plan came: the same state, same table
  plugin_ = next;
  // Probation: the loss of the steps before it is what the new code is held to.
  probation_from_ = s;
  probation_limit_ = update::loss_limit(recent_losses_, cfg_.update().max_loss_jump());
  store_->set(keys::update_applied_key(id, o_.rank), std::to_string(s));
  if (leader_ && !o_.quiet) {
    std::printf("keel: plugin %s %s (%s, build %s) from step %lld\n", plugin_->name().c_str(),
                plugin_->version().c_str(), plugin_->path().c_str(), plugin_->hash().c_str(),
                static_cast<long long>(s + 1));
    std::fflush(stdout);
  }
}

bool Worker::on_probation(int64_t step) const {
  return update::on_probation(probation_from_, step, cfg_.update().probation_steps());
}

void Worker::update_after_step(const StepStats& st) {
  recent_losses_.push_back(st.loss);
  if (recent_losses_.size() > 10) recent_losses_.pop_front();
  if (!on_probation(st.step) || !probation_limit_ || st.loss <= *probation_limit_) return;
  // Every rank sees the same global loss: every rank fails here alike.
  const std::string why =
      detail::concat("loss ", st.loss, " at step ", st.step + 1, " is above ", *probation_limit_,
                     " = (1 + update.max_loss_jump ", cfg_.update().max_loss_jump(),
                     ") x the mean loss before the update");
  if (recovery_) store_->set(keys::update_failure_key(epoch_), why);
  throw UpdateProbationFailed(why);
}

void Worker::adopt_plugin(const std::string& path, const std::string& hash) {
  if (path.empty() || hash == plugin_->hash()) return;
  probation_from_ = -1;  // a rollback, or a lazy update: judged again only when applied
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
  std::string current;
  try {
    current = store_->get(keys::kPluginCurrent, std::chrono::milliseconds(1));
  } catch (const CommTimeout&) {
    return;  // never updated: the config's plugin
  }
  const size_t sp = current.find(' ');
  if (sp == std::string::npos) return;
  adopt_plugin(current.substr(sp + 1), current.substr(0, sp));
}

void Worker::stop_update_watch() {
  update_stop_ = true;
  if (update_thread_.joinable()) update_thread_.join();
}

}  // namespace keel::worker_detail
