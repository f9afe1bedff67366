// The job's history as rank 0 reads it back from the store for its report
// (launcher/job_history.h), with an in-memory store.
#include "launcher/job_history.h"

#include <gtest/gtest.h>

#include <cmath>

#include "launcher/recovery_protocol.h"
#include "parallel/comm_error.h"
#include "parallel/hash_store.h"
#include "proto/store_values.pb.h"

namespace keel {
namespace {

// A HashStore that notes every wait that ended without its key (the key and how long it was
// waited for): "the lost record was not waited for" is a wait with the short bound, not the
// record wait, whatever the machine's load.
class WaitLog : public HashStore {
 public:
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      return HashStore::get(key, timeout);
    } catch (const CommTimeout&) {
      missed.emplace_back(key, timeout);
      throw;
    }
  }
  std::vector<std::pair<std::string, std::chrono::milliseconds>> missed;
};

void set_start_step(Store& store, int64_t step) {
  store::Step s;
  s.set_step(step);
  set_message(store, keys::kStartStep, s);
}

// An evaluation cut short by a failure (a rank hung in it, say) is never run again: the job
// goes on from the step it followed. Its point is missing from the curve; the report, and
// the trained state with it, must not be lost waiting for it.
TEST(JobHistory, AnEvaluationLostToAFailureIsLeftOutOfTheCurve) {
  WaitLog store;
  config::JobConfig cfg;
  cfg.mutable_train()->set_steps(10);
  cfg.mutable_train()->set_eval_every(5);
  set_start_step(store, 0);
  for (int s = 0; s < 10; ++s) {
    report::StepRecord r;
    r.set_step(s);
    r.set_loss(1.0 / (s + 1));
    r.set_wall_s(0.01);
    store.set(keys::step_key(s), r.SerializeAsString());
  }
  store::Eval eval;
  eval.set_loss(0.5);
  set_message(store, keys::eval_key(10), eval);  // the one after step 5 never ran
  report::RunReport rep;
  read_job_history(store, cfg, /*world=*/1, /*has_val=*/true, /*job_start=*/0, &rep);
  using Missed = decltype(store.missed);
  EXPECT_EQ(store.missed, (Missed{{keys::eval_key(5), kEvalWait}}));
  ASSERT_EQ(rep.val_steps_size(), 1);
  EXPECT_EQ(rep.val_steps(0), 10);
  EXPECT_EQ(rep.val_losses(0), 0.5);
  EXPECT_EQ(rep.losses_size(), 10);
}

// Steps whose record neither rank 0 nor its witness wrote (both died before): the report is
// still written, says which and why, and holds NaN there (null in its JSON), never the step
// before's value; their time is not counted, and the final loss is the last one measured.
TEST(JobHistory, AStepRecordLostWithRankZeroAndItsWitnessIsAGap) {
  WaitLog store;
  config::JobConfig cfg;
  cfg.mutable_train()->set_steps(6);
  set_start_step(store, 0);
  for (int s : {0, 1, 2, 4}) {
    report::StepRecord r;
    r.set_step(s);
    r.set_loss(10.0 - s);
    r.set_wall_s(0.5);
    r.set_end_at(100 + s);
    store.set(keys::step_key(s), r.SerializeAsString());
  }
  report::RunReport rep;
  const JobHistory h =
      read_job_history(store, cfg, /*world=*/1, /*has_val=*/false, /*job_start=*/100, &rep);
  using Missed = decltype(store.missed);
  // One wait, for the first missing record: the writers flushed before the report is read.
  EXPECT_EQ(store.missed, (Missed{{keys::step_key(3), kStepRecordWait}}));
  ASSERT_EQ(rep.losses_size(), 6);
  EXPECT_TRUE(std::isnan(rep.losses(3)));
  EXPECT_TRUE(std::isnan(rep.grad_norms(3)));
  EXPECT_TRUE(std::isnan(rep.lrs(3)));
  EXPECT_TRUE(std::isnan(rep.step_end_s(3)));
  EXPECT_TRUE(std::isnan(rep.losses(5)));
  EXPECT_EQ(rep.losses(4), 6.0);
  EXPECT_EQ(rep.step_end_s(4), 4.0);  // seconds since the job's start
  EXPECT_EQ(std::vector<int>(rep.steps_without_record().begin(), rep.steps_without_record().end()),
            (std::vector<int>{3, 5}));
  EXPECT_NE(rep.steps_without_record_why().find("witness"), std::string::npos);
  EXPECT_EQ(rep.final_loss(), 6.0);
  EXPECT_DOUBLE_EQ(h.kept_s, 2.0);
}

// Rank 0 died before its batch went out; its witness on another machine wrote the same
// records (step_copy/<S>): the report has every step, the copies where rank 0's are missing,
// rank 0's own where both exist.
TEST(JobHistory, TheWitnesssCopiesFillWhatRankZeroDidNotWrite) {
  WaitLog store;
  config::JobConfig cfg;
  cfg.mutable_train()->set_steps(5);
  set_start_step(store, 0);
  for (int s = 0; s < 5; ++s) {
    report::StepRecord r;
    r.set_step(s);
    r.set_loss(10.0 - s);
    r.set_wall_s(0.5);
    if (s < 2) store.set(keys::step_key(s), r.SerializeAsString());
    r.set_wall_s(0.25);  // the witness's own time: its copy is told apart by it
    if (s >= 1) store.set(keys::step_copy_key(s), r.SerializeAsString());
  }
  report::RunReport rep;
  const JobHistory h =
      read_job_history(store, cfg, /*world=*/1, /*has_val=*/false, /*job_start=*/0, &rep);
  EXPECT_TRUE(store.missed.empty());
  EXPECT_EQ(rep.steps_without_record_size(), 0);
  ASSERT_EQ(rep.losses_size(), 5);
  for (int s = 0; s < 5; ++s) EXPECT_EQ(rep.losses(s), 10.0 - s);
  EXPECT_DOUBLE_EQ(h.kept_s, 2 * 0.5 + 3 * 0.25);
}

// Epoch 1 ran steps 0-4 and rank 0 recorded them; epoch 2 restored at step 2 (a corrupt
// state, say: its attempt computed other numbers) and reran steps 2-3 before rank 0 died with
// its batch: its witness's copies (epoch 2) are the steps', not rank 0's older records, and
// step 4, which only the rolled-back attempt recorded, is a gap that says why.
TEST(JobHistory, ARolledBackAttemptsRecordsGiveWayToTheRerunsAndAreNeverShownAlone) {
  WaitLog store;
  config::JobConfig cfg;
  cfg.mutable_train()->set_steps(5);
  set_start_step(store, 0);
  report::StepRecord r;
  r.set_wall_s(1);
  r.set_epoch(1);
  for (int s = 0; s < 5; ++s) {
    r.set_step(s);
    r.set_loss(100 + s);
    store.set(keys::step_key(s), r.SerializeAsString());
  }
  report::Incident inc;
  inc.set_kind("crash");
  inc.set_epoch(2);
  inc.set_restored_step(2);
  inc.set_restored_from("memory");
  set_message(store, keys::incident_key(store.add(keys::kIncidentCount, 1) - 1), inc);
  store::Time restored;  // the ranks of epoch 2 restored
  restored.set_at(50);
  set_message(store, keys::restored_key(2, 0), restored);
  report::Incident stop = inc;  // a stop's epoch: planned, no rank restored in it
  stop.set_kind("exit");
  stop.set_epoch(3);
  stop.set_restored_step(-1);
  set_message(store, keys::incident_key(store.add(keys::kIncidentCount, 1) - 1), stop);
  r.set_epoch(2);
  for (int s = 2; s < 4; ++s) {
    r.set_step(s);
    r.set_loss(s);
    store.set(keys::step_copy_key(s), r.SerializeAsString());
  }
  report::RunReport rep;
  read_job_history(store, cfg, /*world=*/1, /*has_val=*/false, /*job_start=*/0, &rep);
  ASSERT_EQ(rep.losses_size(), 5);
  EXPECT_EQ(rep.losses(0), 100);
  EXPECT_EQ(rep.losses(1), 101);
  EXPECT_EQ(rep.losses(2), 2);
  EXPECT_EQ(rep.losses(3), 3);
  EXPECT_TRUE(std::isnan(rep.losses(4)));
  ASSERT_EQ(rep.steps_without_record_size(), 1);
  EXPECT_EQ(rep.steps_without_record(0), 4);
  EXPECT_NE(rep.steps_without_record_why().find("rolled back"), std::string::npos)
      << rep.steps_without_record_why();
  EXPECT_EQ(rep.final_loss(), 3);
}

// An incident's timeline and each rank's source come from the ranks' typed values: the
// latest restore time, the first step after it, and where each rank's state came from, named
// as the membership's Source enum names it.
TEST(JobHistory, AnIncidentIsCompletedWithTheRanksRestoreTimesAndSources) {
  HashStore store;
  config::JobConfig cfg;
  cfg.mutable_train()->set_steps(1);
  set_start_step(store, 0);
  report::StepRecord r;
  r.set_step(0);
  store.set(keys::step_key(0), r.SerializeAsString());
  report::Incident inc;
  inc.set_kind("hang");
  inc.set_rank(1);
  inc.set_epoch(4);
  inc.set_detected_at(10);
  set_message(store, keys::incident_key(store.add(keys::kIncidentCount, 1) - 1), inc);
  const membership::Source sources[] = {membership::memory, membership::own_snapshot,
                                        membership::backup};
  for (int rank = 0; rank < 3; ++rank) {
    store::Time t;
    t.set_at(20 + rank);
    set_message(store, keys::restored_key(4, rank), t);
    store::Restored from;
    from.set_source(sources[rank]);
    set_message(store, keys::restored_from_key(4, rank), from);
  }
  store::Time first;
  first.set_at(30);
  set_message(store, keys::first_step_key(4), first);
  report::RunReport rep;
  read_job_history(store, cfg, /*world=*/3, /*has_val=*/false, /*job_start=*/0, &rep);
  ASSERT_EQ(rep.incidents_size(), 1);
  const report::Incident& got = rep.incidents(0);
  EXPECT_EQ(got.restored_at(), 22);
  EXPECT_EQ(got.recovered_at(), 22);
  EXPECT_EQ(got.first_step_at(), 30);
  EXPECT_EQ(got.rank_sources().at(0), "memory");
  EXPECT_EQ(got.rank_sources().at(1), "own_snapshot");
  EXPECT_EQ(got.rank_sources().at(2), "backup");
}

}  // namespace
}  // namespace keel
