#include "bench/bench_report.h"

#include "bench/tfevents.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>

#include "proto/json_gaps.h"

namespace keel::bench {
namespace {

// b − a when both were recorded (0 means not recorded), else 0.
double span(double a, double b) {
  return a > 0 && b > 0 && b >= a ? b - a : 0;
}

}  // namespace

LostTime lost_time(const report::RunReport& r, double step_s) {
  LostTime t;
  for (const report::Incident& inc : r.incidents()) {
    const double detected = inc.detected_at();
    const double evicted = inc.evicted_at() > 0 ? inc.evicted_at() : detected;
    const double rebuilt = inc.rebuilt_at() > 0 ? inc.rebuilt_at() : evicted;
    const double restored = inc.restored_at() > 0 ? inc.restored_at() : inc.recovered_at();
    t.set_detection(t.detection() + span(inc.injected_at(), detected));
    t.set_eviction(t.eviction() + span(detected, evicted));
    t.set_rebuild(t.rebuild() + span(evicted, rebuilt));
    t.set_restore(t.restore() + span(rebuilt, restored));
    t.set_first_step(t.first_step() + span(restored, inc.first_step_at()));
    t.set_lost_steps(t.lost_steps() + inc.steps_lost() * step_s);
  }
  const double named =
      t.detection() + t.eviction() + t.rebuild() + t.restore() + t.first_step() + t.lost_steps();
  t.set_other(std::max(0.0, r.wall_s() - r.productive_s() - named));
  for (const report::RankProcesses& p : r.ranks())
    t.set_restarts(t.restarts() + std::max(0, p.pids_size() - 1));
  return t;
}

BenchRun make_run(const std::string& name, const std::string& policy, int exit_code,
                  const report::RunReport& r, double step_s, double tokens_per_step,
                  const std::string& reference_checksum) {
  BenchRun b;
  b.set_name(name);
  b.set_policy(policy);
  b.set_exit_code(exit_code);
  b.set_ok(exit_code == 0 && r.steps_completed() > 0);
  b.set_tokens_per_s(r.tokens_per_s());
  b.set_mfu(r.mfu());
  b.set_ettr(r.ettr());
  b.set_wall_s(r.wall_s());
  b.set_productive_s(r.productive_s());
  *b.mutable_lost() = lost_time(r, step_s);
  *b.mutable_incidents() = r.incidents();
  b.set_param_checksum(r.param_checksum());
  b.set_bitwise_equal(!r.param_checksum().empty() &&
                      (reference_checksum.empty() || r.param_checksum() == reference_checksum));
  b.set_steps_completed(r.steps_completed());
  if (r.has_final_loss()) b.set_final_loss(r.final_loss());
  *b.mutable_losses() = r.losses();
  *b.mutable_step_end_s() = r.step_end_s();
  // A step's rate from the time since the previous kept step ended: a recovery shows as the
  // dip of the step after it. The first step has no predecessor; it takes the second's.
  const int n = r.step_end_s_size();
  const double mfu_per_token_s = r.tokens_per_s() > 0 ? r.mfu() / r.tokens_per_s() : 0;
  for (int i = 0; i < n; ++i) {
    const int j = n > 1 ? std::max(i, 1) : 0;
    const double dt = n > 1 ? r.step_end_s(j) - r.step_end_s(j - 1) : r.wall_s();
    // A step without record, or after one, has no rate that keel measured: NaN (null).
    const double tps = std::isnan(dt) ? dt : dt > 0 ? tokens_per_step / dt : 0;
    b.add_step_tokens_per_s(tps);
    b.add_step_mfu(tps * mfu_per_token_s);
  }
  return b;
}

std::string report_json(const BenchReport& rep) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(rep, &out, o).ok())
    throw std::runtime_error("keel-bench: the report cannot be printed as JSON");
  return nan_as_null(out);
}

void write_run_events(const std::string& dir, const BenchRun& r, double step_s,
                      const ScalarSink& also) {
  EventWriter w(dir);
  auto scalar = [&](const std::string& tag, int64_t step, double t, double v) {
    // A value not measured is left out: TensorBoard draws the curve around the gap.
    if (std::isnan(v) || std::isnan(t)) return;
    w.scalar(tag, step, t, v);
    if (also) also(tag, step, t, v);
  };
  for (int i = 0; i < r.losses_size() && i < r.step_end_s_size(); ++i) {
    const double t = r.started_at() + r.step_end_s(i);
    scalar("loss", i, t, r.losses(i));
    scalar("mfu", i, t, r.step_mfu(i));
    scalar("tokens_per_s", i, t, r.step_tokens_per_s(i));
    const double kept = r.steps_completed() > 0 ? r.productive_s() / r.losses_size() : step_s;
    scalar("ettr", i, t, r.step_end_s(i) > 0 ? std::min(1.0, (i + 1) * kept / r.step_end_s(i)) : 0);
  }
  w.close();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  f.close();
  if (f.fail()) throw std::runtime_error("cannot write " + path);
}

}  // namespace keel::bench
