// The job's end on a rank (Worker::finish): the last checkpoint settled, every rank's
// figures and the full parameters gathered to rank 0, and rank 0's outputs: the report, the
// loss chart, the exported weights and the closing line.
#include "launcher/job_history.h"
#include "launcher/worker/worker_impl.h"
#include "model/llmc_checkpoint.h"
#include "proto/store_keys.h"
#include "runtime/cpu/blas_core.h"
#include "runtime/cpu/cpu_features.h"
#include "runtime/logging.h"

namespace keel {
namespace worker_detail {
namespace {

// How long the report waits for a figure another process set before it (an update's
// record, a rank's fail-slow figures): only a loaded store is slow.
constexpr std::chrono::milliseconds kFigureWait{1000};

}  // namespace

void Worker::finish() {
  updates_->stop();
  snapshots_->finish(leader_, *groups().world);
  settle_checkpoint();  // the last save's outcome, now that it is written
  // The job's steps are those it ran: the report covers them, not the configured ones.
  const int64_t configured_steps = cfg_.train().steps();
  const bool checkpoint_stop = snapshots_->stopped();
  if (checkpoint_stop) {
    const int64_t ran = state_->step();
    // The report has a validation loss at the last step (every rank evaluates alike).
    if (val_ && ran < configured_steps && ran % cfg_.train().eval_every() != 0) {
      const double vl = trainer_->evaluate(*val_, cfg_.train().eval_batches());
      if (leader_) JobRecord::eval(*store_, ran, vl);
    }
    cfg_.mutable_train()->set_steps(int(ran));
    exit_code_ = recovery::kExitWriteFailed;
  }
  if (recovery_) recovery_->stop_watch();
  // Every rank's figures reach rank 0's report through the store: set before the gather,
  // which rank 0 leaves only after every rank entered it.
  if (!leader_ && env_.supervised)
    set_message(*store_, keys::rank_perf_key(o_.rank), round_meter_.perf(o_.rank));
  NamedTensors full = trainer_->gather_full_params();
  if (leader_) {
    RunReport rep;
    fill_report(&rep);
    ParamDigest digest;
    for (const auto& name : trainer_->canonical_names()) digest.add(name, full.at(name));
    rep.set_param_checksum(digest.hex());
    rep.set_stopped_on_checkpoint_error(checkpoint_stop);
    // A full disk at the end costs the file it fills, never the others: the trained weights
    // first, then the report and the chart, each tried; the exit code says one failed.
    auto output = [&](const char* flag, const std::string& path, const auto& write) {
      if (path.empty()) return;
      try {
        write();
      } catch (const std::exception& e) {
        LOG(ERROR) << flag << " " << path << ": not written: " << e.what();
        exit_code_ = recovery::kExitWriteFailed;
      }
    };
    output("--export-llmc", o_.export_llmc_path,
           [&] { write_llmc_checkpoint(o_.export_llmc_path, trainer_->dims(), full); });
    output("--report", o_.report_path, [&] { write_report_json(o_.report_path, rep); });
    // The controller that stops the job next (a checkpoint stop) keeps this report.
    if (env_.supervised) store_->add(keys::kReportsWritten, 1);
    output("--loss-svg", o_.loss_svg_path, [&] { write_loss_svg(o_.loss_svg_path, rep); });
    std::string ckpt_text;
    if (rep.checkpoint_write_failures() > 0)
      ckpt_text =
          detail::concat("; PERSISTENT CHECKPOINTS FAILED: ", rep.checkpoint_write_failures(),
                         " write(s), the last: ", rep.checkpoint_last_error());
    if (checkpoint_stop)
      ckpt_text += detail::concat("; stopped after step ", state_->step(), " of ", configured_steps,
                                  " (checkpoint.on_write_error: stop)");
    char mfu_text[16] = "n/a";
    if (rep.mfu_unavailable().empty())
      std::snprintf(mfu_text, sizeof(mfu_text), "%.1f%%", 100 * rep.mfu());
    if (!o_.quiet)
      std::printf(
          "keel: done: %d steps, final loss %.6f, %.0f tok/s, MFU %s of %.3g FLOP/s "
          "(%s), params %s, ETTR %.3f, %d incident(s), %.1f s%s\n",
          rep.steps_completed(), rep.final_loss(), rep.tokens_per_s(), mfu_text,
          rep.mfu_peak_flops(), rep.mfu_peak_source().c_str(), rep.param_checksum().c_str(),
          rep.ettr(), rep.incidents_size(), rep.wall_s(), ckpt_text.c_str());
  }
  // Keep every rank's communicators alive until rank 0 has its gather.
  groups().world->barrier();
}

void Worker::fill_report(RunReport* rep) {
  rep->set_plugin(plugin_->name());
  rep->set_plugin_version(plugin_->version());
  rep->set_backend(backend_->name());
  const Topology& topo = members_.topo();
  rep->set_layout(layout_name(topo));
  rep->set_world_size(topo.world_size());
  rep->set_num_params(double(trainer_->global_param_count()));
  const Peak& peak = mfu_.peak();
  rep->set_mfu_peak_flops(peak.flops_per_s);
  rep->set_mfu_peak_source(peak.source);
  rep->set_mfu_theoretical_peak_flops(peak.theoretical_flops_per_s);
  rep->set_mfu_theoretical_peak_source(peak.theoretical_source);
  if (backend_->kind() == DeviceKind::kCpu) {
    const BlasPath blas = blas_path();
    rep->set_blas(blas.config);
    rep->set_blas_core(blas.core);
    rep->set_blas_core_best(blas.best);
    rep->set_blas_core_chosen_by(blas.chosen_by);
    rep->set_cpu_model(cpu_features().describe());
    rep->set_cpu_isa(cpu_features().isa());
  }
  rep->set_recovery_mode(config::RecoveryConfig::Mode_Name(cfg_.recovery().mode()));
  const int64_t steps = cfg_.train().steps();
  record_->flush(*store_);  // the last second's steps
  const JobHistory h =
      read_job_history(*store_, cfg_, topo.world_size(), val_ != nullptr, env_.job_start, rep);
  const double kept_s = h.kept_s, timed_s = h.timed_s, timed_tokens = h.timed_tokens;
  rep->set_steps_completed(int(steps));
  rep->set_tokens_per_s(timed_s > 0 ? timed_tokens / timed_s : 0);
  const Mfu m = mfu(rep->tokens_per_s());
  rep->set_mfu(m.value);
  if (!m.valid && rep->tokens_per_s() > 0) rep->set_mfu_unavailable(m.why_not);
  rep->set_wall_s(unix_now() - env_.job_start);
  rep->set_job_start_at(env_.job_start);
  rep->set_ettr(rep->wall_s() > 0 ? kept_s / rep->wall_s() : 0);
  rep->set_productive_s(kept_s);
  const int64_t updates = store_->add(keys::kUpdateCount, 0);
  for (int64_t n = 0; n < updates; ++n) {
    // An update's record is written when it ends; one still in progress has none.
    try {
      *rep->add_updates() =
          get_message<report::Update>(*store_, keys::update_record_key(n), kFigureWait);
    } catch (const CommTimeout&) {
    }
  }
  *rep->add_rank_perf() = round_meter_.perf(o_.rank);
  for (int r = 1; env_.supervised && r < topo.world_size(); ++r) {
    // Set before the gather that rank 0 leaves only after every rank entered it; a rank that
    // died meanwhile has none.
    try {
      *rep->add_rank_perf() =
          get_message<report::RankPerf>(*store_, keys::rank_perf_key(r), kFigureWait);
    } catch (const CommTimeout&) {
    }
  }
  rep->set_sdc_check_every_steps(sdc_->every());
  sdc_->count_the_rest(*store_);
  rep->set_sdc_checks(int(store_->add(keys::kSdcChecks, 0)));
  rep->set_sdc_check_seconds(sdc_->seconds());
  rep->set_sdc_check_share(sdc_->share());
  rep->set_sdc_coverage(sdc_->coverage(topo, snapshots_->region() != nullptr));
  for (const std::string& m : sdc_->missed(FaultInjector::read_injections(*store_), *rep, topo))
    rep->add_sdc_missed(m);
  snapshots_->fill_report(rep, *state_, sdc_->every() > 0, o_.rank);
}

}  // namespace worker_detail
}  // namespace keel
