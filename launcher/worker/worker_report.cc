// The job's end on a rank (Worker::finish): the last checkpoint settled, every rank's
// figures and the full parameters gathered to rank 0, and rank 0's outputs: the report, the
// loss chart, the exported weights and the closing line.
#include "launcher/worker/worker_impl.h"
#include "runtime/logging.h"

namespace keel {
namespace worker_detail {

void Worker::finish() {
  stop_update_watch();
  if (snapshotter_) snapshotter_->wait_idle();
  if (checkpointer_) {
    // Every rank that lives has published its part of the last save once it has waited for
    // its own write; a part still missing then belongs to a rank that failed while saving,
    // and rank 0 stops waiting for it.
    if (!leader_) checkpointer_->wait();
    groups_->world->barrier();
    checkpointer_->abandon_unsealed();
    checkpointer_->wait();
  }
  settle_checkpoint();  // the last save's outcome, now that it is written
  // The job's steps are those it ran: the report covers them, not the configured ones.
  const int64_t configured_steps = cfg_.train().steps();
  if (checkpoint_stop_) {
    const int64_t ran = state_->step();
    // The report has a validation loss at the last step (every rank evaluates alike).
    if (val_ && ran < configured_steps && ran % cfg_.train().eval_every() != 0) {
      const double vl = trainer_->evaluate(*val_, cfg_.train().eval_batches());
      char buf[40];
      std::snprintf(buf, sizeof(buf), "%.17g", vl);
      if (leader_) store_->set(keys::eval_key(ran), buf);
    }
    cfg_.mutable_train()->set_steps(int(ran));
    exit_code_ = recovery::kExitWriteFailed;
  }
  if (recovery_) recovery_->stop_watch();
  // Every rank's figures reach rank 0's report through the store: set before the gather,
  // which rank 0 leaves only after every rank entered it.
  if (!leader_ && env_.supervised)
    store_->set(keys::rank_perf_key(o_.rank), round_meter_.perf(o_.rank).SerializeAsString());
  NamedTensors full = trainer_->gather_full_params();
  if (leader_) {
    RunReport rep;
    fill_report(&rep);
    ParamDigest digest;
    for (const auto& name : trainer_->canonical_names()) digest.add(name, full.at(name));
    rep.set_param_checksum(digest.hex());
    rep.set_stopped_on_checkpoint_error(checkpoint_stop_);
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
    output("--loss-svg", o_.loss_svg_path, [&] { write_loss_svg(o_.loss_svg_path, rep); });
    std::string ckpt_text;
    if (rep.checkpoint_write_failures() > 0)
      ckpt_text =
          detail::concat("; PERSISTENT CHECKPOINTS FAILED: ", rep.checkpoint_write_failures(),
                         " write(s), the last: ", rep.checkpoint_last_error());
    if (checkpoint_stop_)
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
  groups_->world->barrier();
}

void Worker::fill_report(RunReport* rep) {
  rep->set_plugin(plugin_->name());
  rep->set_plugin_version(plugin_->version());
  rep->set_backend(backend_->name());
  rep->set_layout(layout_name(topo_));
  rep->set_world_size(topo_.world_size());
  rep->set_num_params(double(trainer_->global_param_count()));
  rep->set_mfu_peak_flops(peak_.flops_per_s);
  rep->set_mfu_peak_source(peak_.source);
  rep->set_mfu_theoretical_peak_flops(peak_.theoretical_flops_per_s);
  rep->set_mfu_theoretical_peak_source(peak_.theoretical_source);
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
  const JobHistory h = read_job_history(*store_, cfg_, topo_.world_size(), val_ != nullptr, rep);
  for (double& t : *rep->mutable_step_end_s()) t = t > 0 ? t - env_.job_start : 0;
  const double kept_s = h.kept_s, timed_s = h.timed_s, timed_tokens = h.timed_tokens;
  rep->set_steps_completed(int(steps));
  if (rep->losses_size() > 0) rep->set_final_loss(rep->losses(rep->losses_size() - 1));
  rep->set_tokens_per_s(timed_s > 0 ? timed_tokens / timed_s : 0);
  const Mfu mfu = honest_mfu(trainer_->model_flops_per_token() * rep->tokens_per_s(), peak_);
  rep->set_mfu(mfu.value);
  if (!mfu.valid && rep->tokens_per_s() > 0) rep->set_mfu_unavailable(mfu.why_not);
  if (!mfu.valid && peak_.flops_per_s > 0 && rep->tokens_per_s() > 0 && !mfu_refused_) {
    mfu_refused_ = true;
    LOG(WARNING) << mfu.why_not << "; its cache is dropped";
    forget_peak(peak_);
  }
  rep->set_wall_s(unix_now() - env_.job_start);
  rep->set_job_start_at(env_.job_start);
  rep->set_ettr(rep->wall_s() > 0 ? kept_s / rep->wall_s() : 0);
  rep->set_productive_s(kept_s);
  const int64_t updates = store_->add(keys::kUpdateCount, 0);
  for (int64_t n = 0; n < updates; ++n) {
    try {
      rep->add_updates()->ParseFromString(
          store_->get(keys::update_record_key(n), std::chrono::milliseconds(1000)));
    } catch (const CommTimeout&) {
    }
  }
  *rep->add_rank_perf() = round_meter_.perf(o_.rank);
  for (int r = 1; env_.supervised && r < topo_.world_size(); ++r) {
    try {
      rep->add_rank_perf()->ParseFromString(
          store_->get(keys::rank_perf_key(r), std::chrono::milliseconds(1000)));
    } catch (const CommTimeout&) {
    }
  }
  rep->set_sdc_check_every_steps(sdc_every_);
  rep->set_sdc_checks(int(store_->add(keys::kSdcChecks, 0)));
  rep->set_sdc_check_seconds(sdc_seconds_);
  rep->set_sdc_check_share(steps_wall_s_ > 0 ? sdc_seconds_ / steps_wall_s_ : 0);
  rep->set_sdc_coverage(sdc_coverage());
  for (const std::string& m : sdc_missed(*rep)) rep->add_sdc_missed(m);
  if (snapshotter_) {
    const SnapshotStats ss = snapshotter_->stats();
    rep->set_snapshot_blocked_s(ss.wait_idle_seconds);
    rep->set_snapshot_bytes(double(state_->bytes()));
    rep->set_backup_bytes_per_step(ss.copies > 0 ? double(ss.bytes_pushed) / double(ss.copies) : 0);
    rep->set_snapshot_in_slots(snapshotter_->in_slots());
    rep->set_backup_mode(holder_ < 0 ? "none" : replica_holder_ ? "replica" : "pushed");
    double host = double(region_->mapped_bytes());
    if (sdc_every_ <= 0) host -= double(region_->verified_slot_bytes());  // never touched
    if (!snapshotter_->in_slots()) host += double(state_->bytes());       // the live state
    if (auto held = SnapshotRegion::open_existing(backup_segment_name(env_.job, o_.rank)))
      host += double(held->mapped_bytes());
    rep->set_state_host_bytes(host);
    rep->set_state_host_ratio(host / double(state_->bytes()));
  }
}

}  // namespace worker_detail
}  // namespace keel
