// The job's history as rank 0 reads it back from the store for its report
// (launcher/job_history.h), with an in-memory store.
#include "launcher/job_history.h"

#include <gtest/gtest.h>

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
  read_job_history(store, cfg, /*world=*/1, /*has_val=*/true, &rep);
  using Missed = decltype(store.missed);
  EXPECT_EQ(store.missed, (Missed{{keys::eval_key(5), kEvalWait}}));
  ASSERT_EQ(rep.val_steps_size(), 1);
  EXPECT_EQ(rep.val_steps(0), 10);
  EXPECT_EQ(rep.val_losses(0), 0.5);
  EXPECT_EQ(rep.losses_size(), 10);
}

// A rank 0 that died between its update and the step's record (found hung there) is restored
// past the step: that record never comes. The report is still written, and says which.
TEST(JobHistory, AStepRecordLostWithRankZeroIsNamedNotWaitedFor) {
  WaitLog store;
  config::JobConfig cfg;
  cfg.mutable_train()->set_steps(6);
  set_start_step(store, 0);
  for (int s : {0, 1, 2, 4, 5}) {
    report::StepRecord r;
    r.set_step(s);
    r.set_loss(10.0 - s);
    r.set_wall_s(0.5);
    store.set(keys::step_key(s), r.SerializeAsString());
  }
  report::RunReport rep;
  const JobHistory h = read_job_history(store, cfg, /*world=*/1, /*has_val=*/false, &rep);
  using Missed = decltype(store.missed);
  EXPECT_EQ(store.missed, (Missed{{keys::step_key(3), kStepRecordWait}}));
  ASSERT_EQ(rep.losses_size(), 6);
  EXPECT_EQ(rep.losses(3), rep.losses(2));  // the step before's value, said so below
  EXPECT_EQ(rep.steps_without_record_size(), 1);
  EXPECT_EQ(rep.steps_without_record(0), 3);
  EXPECT_DOUBLE_EQ(h.kept_s, 2.5);  // its time is not counted
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
  read_job_history(store, cfg, /*world=*/3, /*has_val=*/false, &rep);
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
