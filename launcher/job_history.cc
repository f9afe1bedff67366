#include "launcher/job_history.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/recovery_protocol.h"
#include "proto/store_values.pb.h"
#include "robust/fault_injector.h"

namespace keel {
namespace {

// The incident's rank_sources name of where a rank's state came from.
std::string source_name(membership::Source s) {
  return membership::Source_Name(s);
}

// The witness's copies (step_copy/<S>) by step: one read where the store lists its keys,
// else nullopt and the caller reads them one by one.
std::optional<std::map<int64_t, report::StepRecord>> read_copies(Store& store) {
  std::optional<Store::KeyValues> kvs = store.try_get_prefix(keys::kStepCopyPrefix);
  if (!kvs) return std::nullopt;
  std::map<int64_t, report::StepRecord> copies;
  for (const auto& [key, value] : *kvs) {
    report::StepRecord r;
    KEEL_CHECK(r.ParseFromString(value), "the job's store: ", key, " is not a StepRecord");
    copies[r.step()] = r;
  }
  return copies;
}

// Whether a later epoch restored at or before `r`'s step: `r` is then a rolled-back attempt's
// record, and the rerun's (if any reached the store) is the step's. An incident restored when
// its ranks said so (restored_at, read_incidents) at the step its plan named (restored_from is
// set with it); a stop, an update or an incident lost with its leader restored nothing known.
bool rolled_back(const report::StepRecord& r,
                 const google::protobuf::RepeatedPtrField<report::Incident>& incidents) {
  for (const report::Incident& inc : incidents)
    if (inc.restored_at() > 0 && !inc.restored_from().empty() && inc.epoch() > r.epoch() &&
        inc.restored_step() <= r.step())
      return true;
  return false;
}

// The newer epoch's of rank 0's record and its witness's copy (rank 0's when both are of one
// epoch): a step run again after a rollback has a record of each attempt, and the one from
// the attempt the job kept is what the report shows.
std::optional<report::StepRecord> newer(std::optional<report::StepRecord> own,
                                        std::optional<report::StepRecord> copy) {
  if (!own || (copy && copy->epoch() > own->epoch())) return copy;
  return own;
}

// The steps' records from the start step on, and the validation losses. `incidents` (read
// first) tell a rolled-back attempt's record from the step's.
JobHistory read_steps(Store& store, const config::JobConfig& cfg, bool has_val,
                      report::RunReport* rep) {
  const int64_t steps = cfg.train().steps();
  JobHistory h;
  const int64_t first = get_message<store::Step>(store, keys::kStartStep, kRecordWait).step();
  rep->set_first_step(int(first));
  const std::optional<std::map<int64_t, report::StepRecord>> copies = read_copies(store);
  auto copy_of = [&](int64_t s) -> std::optional<report::StepRecord> {
    if (!copies) return try_get_message<report::StepRecord>(store, keys::step_copy_key(s));
    const auto it = copies->find(s);
    return it == copies->end() ? std::nullopt : std::optional(it->second);
  };
  bool missed = false;
  int lost = 0, superseded = 0;
  for (int64_t s = first; s < steps; ++s) {
    // Rank 0 writes its records in batches, a second apart (launcher/worker/job_record.h);
    // where a rank 0 died before its batch went out, its witness on another machine wrote
    // the same records (step_copy/<S>, launcher/worker/step_witness.h). One wait for a
    // missing record is enough: the writers flushed before the report is read, so the next
    // missing ones are looked up without waiting.
    std::optional<report::StepRecord> got =
        newer(try_get_message<report::StepRecord>(store, keys::step_key(s)), copy_of(s));
    if (!got && !missed) {
      try {
        got = get_message<report::StepRecord>(store, keys::step_key(s),
                                              s == first ? kRecordWait : kStepRecordWait);
      } catch (const CommTimeout&) {
        got = copy_of(s);
        if (!got && s == first) throw;
        missed = true;
      }
    }
    if (got && rolled_back(*got, rep->incidents())) {
      got.reset();
      superseded += 1;
    } else if (!got) {
      lost += 1;
    }
    report::StepRecord r;
    if (got) {
      r = *got;
    } else {
      // Not measured: NaN (null in the JSON), never a neighbour's value.
      rep->add_steps_without_record(int(s));
      r.set_step(s);
      r.set_loss(kNotMeasured);
      r.set_grad_norm(kNotMeasured);
      r.set_lr(kNotMeasured);
      r.set_end_at(kNotMeasured);
    }
    rep->add_losses(r.loss());
    rep->add_step_end_s(r.end_at());  // unix seconds; the caller makes them job-relative
    rep->add_grad_norms(r.grad_norm());
    rep->add_lrs(r.lr());
    rep->set_compute_s(rep->compute_s() + r.compute_s());
    rep->set_comm_s(rep->comm_s() + r.comm_s());
    rep->set_bubble_s(rep->bubble_s() + r.bubble_s());
    rep->set_bytes_tp(rep->bytes_tp() + r.bytes_tp());
    rep->set_bytes_pp(rep->bytes_pp() + r.bytes_pp());
    rep->set_bytes_dp(rep->bytes_dp() + r.bytes_dp());
    rep->set_bytes_emb(rep->bytes_emb() + r.bytes_emb());
    h.kept_s += r.wall_s();
    // The first step pays for page faults and connection warm-up; throughput leaves it out
    // unless it is the only one.
    if (s > first || steps == first + 1) h.timed_s += r.wall_s(), h.timed_tokens += r.tokens();
    const int every = cfg.train().eval_every();
    if (has_val && ((s + 1) % every == 0 || s + 1 == steps)) {
      // An evaluation cut short by a failure is not run again (the job goes on from the
      // step it followed): that point of the curve is missing, not the report.
      try {
        const store::Eval e = get_message<store::Eval>(store, keys::eval_key(s + 1), kEvalWait);
        rep->add_val_steps(double(s + 1));
        rep->add_val_losses(e.loss());
      } catch (const CommTimeout&) {
      }
    }
  }
  std::string why;
  if (lost > 0)
    why = detail::concat(lost,
                         " step(s): neither rank 0's record nor its witness's copy reached the "
                         "job's store: both processes ended before writing them (their machines "
                         "lost together, or every rank restarted); the steps were trained, their "
                         "numbers are not known");
  if (superseded > 0)
    why += detail::concat(why.empty() ? "" : "; ", superseded,
                          " step(s): only the record of an attempt a later recovery rolled back "
                          "reached the job's store, not the rerun's (rank 0 and its witness "
                          "ended before writing it)");
  rep->set_steps_without_record_why(why);
  return h;
}

// The processes that served each rank.
void read_ranks(Store& store, int world, report::RunReport* rep) {
  for (int r = 0; r < world; ++r) {
    report::RankProcesses* rp = rep->add_ranks();
    rp->set_rank(r);
    const int64_t n = store.add(keys::pid_count_key(r), 0);
    for (int64_t i = 0; i < n; ++i) {
      // A rank whose id did not change when the job's layout did registers again: once each.
      const auto one = get_message<report::RankProcesses>(store, keys::pid_key(r, i), kRecordWait);
      for (const int pid : one.pids())
        if (std::find(rp->pids().begin(), rp->pids().end(), pid) == rp->pids().end())
          rp->add_pids(pid);
    }
  }
}

// Incidents: the supervisor's (and rank 0's own), joined with the injection records and the
// ranks' restore times.
void read_incidents(Store& store, int world, report::RunReport* rep) {
  std::vector<InjectionRecord> injections = FaultInjector::read_injections(store);
  std::vector<bool> used(injections.size(), false);
  const int64_t n = store.add(keys::kIncidentCount, 0);
  for (int64_t i = 0; i < n; ++i) {
    report::Incident inc = get_message<report::Incident>(store, keys::incident_key(i), kRecordWait);
    // A rank's own report of a checkpoint it could not write: no fault caused it, no epoch
    // recovered from it.
    if (inc.kind() == "checkpoint_write_failed") {
      rep->set_checkpoint_write_failures(rep->checkpoint_write_failures() + 1);
      rep->set_checkpoint_last_error(inc.detail());
      *rep->add_incidents() = inc;
      continue;
    }
    // The injection that caused it: the newest unused one before its detection, on its rank
    // when the culprit is known.
    int best = -1;
    for (size_t k = 0; k < injections.size(); ++k) {
      const auto& in = injections[k];
      if (used[k] || in.time > inc.detected_at() || in.kind == "slow") continue;
      if (inc.rank() >= 0 && in.rank != inc.rank()) continue;
      if (best < 0 || in.time > injections[size_t(best)].time) best = int(k);
    }
    if (best >= 0) {
      used[size_t(best)] = true;
      inc.set_injected_at(injections[size_t(best)].time);
      // An SDC that no check could pin on a rank stays unattributed: the report says what
      // the job knew, not what the test injected.
      if (inc.rank() < 0 && inc.kind() != "sdc") inc.set_rank(injections[size_t(best)].rank);
      if (inc.kind() == "comm_error" || inc.kind() == "exit" || inc.kind() == "crash")
        inc.set_kind(injections[size_t(best)].kind);
    }
    if (inc.kind() != "nan") {
      double restored = 0;
      for (int r = 0; r < world; ++r) {
        if (auto t = try_get_message<store::Time>(store, keys::restored_key(inc.epoch(), r)))
          restored = std::max(restored, t->at());
        if (auto from =
                try_get_message<store::Restored>(store, keys::restored_from_key(inc.epoch(), r)))
          (*inc.mutable_rank_sources())[r] = source_name(from->source());
      }
      inc.set_recovered_at(restored);
      inc.set_restored_at(restored);
      if (auto t = try_get_message<store::Time>(store, keys::first_step_key(inc.epoch())))
        inc.set_first_step_at(t->at());
    }
    *rep->add_incidents() = inc;
  }
}

}  // namespace

JobHistory read_job_history(Store& store, const config::JobConfig& cfg, int world, bool has_val,
                            double job_start, report::RunReport* rep) {
  read_incidents(store, world, rep);  // first: they tell which attempt's records count
  const JobHistory h = read_steps(store, cfg, has_val, rep);
  for (double& t : *rep->mutable_step_end_s()) t -= job_start;  // NaN stays NaN
  for (int i = rep->losses_size() - 1; i >= 0; --i)
    if (!std::isnan(rep->losses(i))) {
      rep->set_final_loss(rep->losses(i));
      break;
    }
  read_ranks(store, world, rep);
  return h;
}

}  // namespace keel
