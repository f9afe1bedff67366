// JobRecord (launcher/worker/job_record.h) against an in-memory store: what rank 0 writes
// about each step (typed values under proto/store_keys.h's keys), the start step claimed once,
// the NaN retry's incident, and every rank's PIDs, as job_history.h reads them back.
#include "launcher/worker/job_record.h"

#include <gtest/gtest.h>

#include <set>

#include "launcher/job_history.h"
#include "parallel/comm_error.h"
#include "parallel/hash_store.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"

namespace keel {
namespace {

StepStats stats(int64_t step, double loss) {
  StepStats st;
  st.step = step;
  st.loss = loss;
  st.wall_s = 0.25;
  st.tokens = 1000;
  return st;
}

TEST(JobRecord, EachStepLeavesItsRecordTheProgressAndTheEpochsFirstStep) {
  HashStore store;
  JobRecord rec(/*supervised=*/true, /*job_start=*/1.0);
  rec.new_epoch(2);
  Peak peak;
  peak.flops_per_s = 1e12;
  rec.step(store, stats(4, 3.5), 1e6, peak);
  EXPECT_EQ(
      get_message<report::StepRecord>(store, keys::step_key(4), std::chrono::seconds(1)).loss(),
      3.5);
  EXPECT_EQ(try_get_message<store::Step>(store, keys::kProgress)->step(), 5);
  const auto live = try_get_message<store::Live>(store, keys::kLive);
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(live->tokens_per_s(), 4000);
  EXPECT_GT(live->mfu(), 0);
  const auto first = try_get_message<store::Time>(store, keys::first_step_key(2));
  ASSERT_TRUE(first.has_value());
  // Only the epoch's first step is its first; the next steps wait for the batch.
  rec.step(store, stats(5, 3.4), 1e6, peak);
  EXPECT_FALSE(store.try_get(keys::step_key(5)).has_value());
  rec.flush(store);
  EXPECT_EQ(try_get_message<store::Time>(store, keys::first_step_key(2))->at(), first->at());
  EXPECT_EQ(try_get_message<store::Step>(store, keys::kProgress)->step(), 6);
}

// The store may be etcd: steps of the same second are one write (set_all), not one each.
TEST(JobRecord, TheStepsOfASecondAreOneWrite) {
  struct Counting : HashStore {
    int sets = 0, batches = 0;
    void set(const std::string& k, const std::string& v) override {
      ++sets;
      HashStore::set(k, v);
    }
    void set_all(const std::vector<std::pair<std::string, std::string>>& kvs) override {
      ++batches;
      for (const auto& [k, v] : kvs) HashStore::set(k, v);
    }
  } store;
  JobRecord rec(/*supervised=*/true, /*job_start=*/1.0);
  for (int s = 0; s < 50; ++s) rec.step(store, stats(s, 3.0), 1e6, Peak{});
  EXPECT_EQ(store.sets, 0);
  EXPECT_EQ(store.batches, 1);  // the epoch's first step, at once
  rec.flush(store);
  EXPECT_EQ(store.batches, 2);
  for (int s = 0; s < 50; ++s) EXPECT_TRUE(store.try_get(keys::step_key(s)).has_value()) << s;
  EXPECT_EQ(try_get_message<store::Step>(store, keys::kProgress)->step(), 50);
}

// A batch that etcd would not take kept the rolled-back attempt's records; the rerun's replace
// them and the later ones, so the next batch names each key once (etcd refuses a write that
// names a key twice) and no rolled-back record lands after the rerun's.
TEST(JobRecord, AStepRunAgainReplacesItsBatchedRecordAndTheLaterOnes) {
  struct Refusing : HashStore {
    bool refuse = true;
    void set_all(const std::vector<std::pair<std::string, std::string>>& kvs) override {
      if (refuse) throw CommError("no quorum");
      std::set<std::string> seen;
      for (const auto& [k, v] : kvs) {
        EXPECT_TRUE(seen.insert(k).second) << k << " twice in one write";
        HashStore::set(k, v);
      }
    }
  } store;
  JobRecord rec(/*supervised=*/true, /*job_start=*/1.0);
  rec.new_epoch(1);
  for (int s = 0; s < 6; ++s) rec.step(store, stats(s, 9.0), 1e6, Peak{});
  rec.flush(store);  // refused: the records wait
  rec.new_epoch(2);  // restored at step 3 and run again
  for (int s = 3; s < 5; ++s) rec.step(store, stats(s, 1.0), 1e6, Peak{});
  store.refuse = false;
  rec.flush(store);
  for (int s = 0; s < 3; ++s) {
    const auto r = try_get_message<report::StepRecord>(store, keys::step_key(s));
    ASSERT_TRUE(r) << s;
    EXPECT_EQ(r->loss(), 9.0);
    EXPECT_EQ(r->epoch(), 1);
  }
  for (int s = 3; s < 5; ++s) {
    const auto r = try_get_message<report::StepRecord>(store, keys::step_key(s));
    ASSERT_TRUE(r) << s;
    EXPECT_EQ(r->loss(), 1.0);
    EXPECT_EQ(r->epoch(), 2);
  }
  EXPECT_FALSE(store.try_get(keys::step_key(5)));  // the rolled-back attempt's, never written
  const auto progress = try_get_message<store::Step>(store, keys::kProgress);
  EXPECT_EQ(progress->step(), 5);
  EXPECT_EQ(progress->epoch(), 2);
}

TEST(JobRecord, WithoutAControllerNoLiveFigures) {
  HashStore store;
  JobRecord rec(false, 1.0);
  rec.step(store, stats(0, 1.0), 1e6, Peak{});
  EXPECT_FALSE(store.try_get(keys::kLive).has_value());
}

TEST(JobRecord, TheStartStepIsClaimedOnce) {
  HashStore store;
  JobRecord::claim_start_step(store, 7);
  JobRecord::claim_start_step(store, 9);  // a later rank 0 (restart_all)
  EXPECT_EQ(try_get_message<store::Step>(store, keys::kStartStep)->step(), 7);
}

TEST(JobRecord, ANonFiniteStepIsRetriedOnceAndItsIncidentFollowsTheRetry) {
  HashStore store;
  JobRecord rec(true, 1.0);
  rec.new_epoch(1);
  EXPECT_TRUE(rec.retry_nonfinite(3, /*leader=*/true, "loss is NaN"));
  EXPECT_FALSE(rec.retry_nonfinite(3, true, "loss is NaN"));  // the retry failed too: stop
  EXPECT_EQ(store.add(keys::kIncidentCount, 0), 0);           // not before the retry is through
  rec.step(store, stats(3, 2.0), 1e6, Peak{});
  ASSERT_EQ(store.add(keys::kIncidentCount, 0), 1);
  const auto inc =
      get_message<report::Incident>(store, keys::incident_key(0), std::chrono::seconds(1));
  EXPECT_EQ(inc.kind(), "nan");
  EXPECT_EQ(inc.step(), 3);
  EXPECT_EQ(inc.epoch(), 1);
  EXPECT_EQ(inc.detail(), "loss is NaN");
  EXPECT_EQ(inc.action(), "update skipped; step retried");
  rec.step(store, stats(4, 2.0), 1e6, Peak{});
  EXPECT_EQ(store.add(keys::kIncidentCount, 0), 1);  // once
}

TEST(JobRecord, PidsAndEvalsReadBackIntoTheReport) {
  HashStore store;
  JobRecord::register_pid(store, 0, 100);
  JobRecord::register_pid(store, 1, 200);
  JobRecord::register_pid(store, 1, 201);  // restarted
  JobRecord::register_pid(store, 1, 201);  // re-laid out under the same id
  JobRecord::claim_start_step(store, 0);
  JobRecord rec(false, 1.0);
  rec.step(store, stats(0, 2.0), 1e6, Peak{});
  JobRecord::eval(store, 1, 1.75);
  config::JobConfig cfg;
  cfg.mutable_train()->set_steps(1);
  cfg.mutable_train()->set_eval_every(1);
  report::RunReport rep;
  read_job_history(store, cfg, /*world=*/2, /*has_val=*/true, /*job_start=*/0, &rep);
  ASSERT_EQ(rep.ranks_size(), 2);
  EXPECT_EQ(rep.ranks(0).pids_size(), 1);
  ASSERT_EQ(rep.ranks(1).pids_size(), 2);
  EXPECT_EQ(rep.ranks(1).pids(1), 201);
  ASSERT_EQ(rep.val_losses_size(), 1);
  EXPECT_EQ(rep.val_losses(0), 1.75);
}

}  // namespace
}  // namespace keel
