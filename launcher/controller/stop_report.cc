#include "launcher/controller/stop_report.h"

#include <algorithm>

#include "launcher/job_history.h"
#include "launcher/recovery_protocol.h"
#include "launcher/run_report.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/logging.h"

namespace keel {

void write_stop_report(Store& store, const config::JobConfig& cfg, double job_start,
                       const std::string& why, const std::string& path, int64_t steps_seen) {
  if (path.empty()) return;
  RunReport rep;
  rep.set_stopped(true);
  rep.set_stop_reason(why);
  rep.set_plugin(cfg.model().plugin());
  const Topology topo(cfg.parallel().tp(), cfg.parallel().pp(), cfg.parallel().dp());
  rep.set_layout(layout_name(topo));
  rep.set_world_size(topo.world_size());
  rep.set_recovery_mode(config::RecoveryConfig::Mode_Name(cfg.recovery().mode()));
  rep.set_job_start_at(job_start);
  try {
    if (store.add(keys::kReportsWritten, 0) > 0) return;
  } catch (const Error& e) {
    // The job's store out of reach for good (its etcd without a quorum): the report says why
    // the job stopped and what the controller saw, without the ranks' step records.
    LOG(ERROR) << "the stopped job's report has no step records: " << e.what();
    rep.set_steps_completed(steps_seen);
    rep.set_wall_s(recovery::unix_now() - job_start);
    write_report_json(path, rep);
    return;
  }
  // The steps rank 0 completed; their records run from the job's start step (a resumed job
  // starts past 0), which rank 0 claims before its first step.
  const auto done = try_get_message<store::Step>(store, keys::kProgress);
  const auto first = try_get_message<store::Step>(store, keys::kStartStep);
  config::JobConfig ran = cfg;
  ran.mutable_train()->set_steps(int(done && first ? std::max(done->step(), first->step()) : 0));
  JobHistory h;
  if (first) {
    h = read_job_history(store, ran, topo.world_size(), cfg.train().eval_every() > 0, job_start,
                         &rep);
  }
  rep.set_steps_completed(std::max<int64_t>(ran.train().steps(), steps_seen));
  rep.set_tokens_per_s(h.timed_s > 0 ? h.timed_tokens / h.timed_s : 0);
  rep.set_wall_s(recovery::unix_now() - job_start);
  rep.set_ettr(rep.wall_s() > 0 ? h.kept_s / rep.wall_s() : 0);
  rep.set_productive_s(h.kept_s);
  write_report_json(path, rep);
}

}  // namespace keel
