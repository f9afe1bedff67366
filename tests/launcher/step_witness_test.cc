// The witness of rank 0's step records (launcher/worker/step_witness.h), with an in-memory
// store: who witnesses, what it writes when a failure ends an epoch (the records after rank
// 0's last batch, as step_copy/<S>), and a step run again replacing its record.
#include "launcher/worker/step_witness.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "parallel/comm_error.h"
#include "parallel/hash_store.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"

namespace keel {
namespace {

membership::Membership placed(std::vector<int> rank_slot) {
  membership::Membership m;
  m.set_tp(1);
  m.set_pp(1);
  m.set_dp(int(rank_slot.size()));
  for (int s : rank_slot) m.add_rank_slot(s);
  return m;
}

report::StepRecord record(int64_t step, double loss, int epoch = 0) {
  report::StepRecord r;
  r.set_step(step);
  r.set_loss(loss);
  r.set_epoch(epoch);
  return r;
}

void set_progress(Store& store, int64_t step, int epoch) {
  store::Step progress;
  progress.set_step(step);
  progress.set_epoch(epoch);
  set_message(store, keys::kProgress, progress);
}

TEST(StepWitness, TheWitnessIsTheFirstRankOnAnotherMachine) {
  EXPECT_EQ(record_witness(placed({0, 0, 1, 1})), 2);
  EXPECT_EQ(record_witness(placed({3, 1, 3})), 1);
  EXPECT_EQ(record_witness(placed({0, 0})), -1);  // one machine: nothing outlives it
  EXPECT_EQ(record_witness(placed({0})), -1);
  membership::Membership nproc;  // keel-worker --nproc: processes of one machine
  nproc.set_tp(2);
  nproc.set_pp(1);
  nproc.set_dp(1);
  EXPECT_EQ(record_witness(nproc), 1);
}

TEST(StepWitness, AFailureWritesTheRecordsAfterRankZerosLastBatch) {
  HashStore store;
  StepWitness w;
  for (int s = 0; s < 10; ++s) w.step(store, record(s, 10 - s));
  EXPECT_FALSE(store.try_get(keys::step_copy_key(0)));  // nothing while the job trains
  set_progress(store, 7, 0);                            // rank 0's batches brought steps 0-6
  ASSERT_TRUE(w.write_missing(store));
  EXPECT_FALSE(w.owed());
  for (int s = 0; s < 7; ++s) EXPECT_FALSE(store.try_get(keys::step_copy_key(s))) << s;
  for (int s = 7; s < 10; ++s) {
    const auto got = try_get_message<report::StepRecord>(store, keys::step_copy_key(s));
    ASSERT_TRUE(got) << s;
    EXPECT_EQ(got->loss(), 10 - s);
  }
}

TEST(StepWitness, AStepRunAgainReplacesItsRecordAndTheLaterOnes) {
  HashStore store;
  StepWitness w;
  for (int s = 0; s < 6; ++s) w.step(store, record(s, 1));
  w.step(store, record(3, 2));  // restored to step 3 and run again
  ASSERT_TRUE(w.write_missing(store));
  EXPECT_EQ(try_get_message<report::StepRecord>(store, keys::step_copy_key(3))->loss(), 2);
  EXPECT_FALSE(store.try_get(keys::step_copy_key(4)));
  EXPECT_FALSE(store.try_get(keys::step_copy_key(5)));
}

// Epoch 1 ran to step 10 and rank 0 recorded it; epoch 2 restored at step 5 and failed at
// step 8 before rank 0's first batch: the progress (epoch 1's) covers none of the rerun, so
// the witness writes all of it, and what it wrote once it does not write again.
TEST(StepWitness, ARolledBackEpochsProgressDoesNotCoverTheRerun) {
  HashStore store;
  StepWitness w;
  for (int s = 0; s < 10; ++s) w.step(store, record(s, 1, /*epoch=*/1));
  set_progress(store, 10, 1);
  ASSERT_TRUE(w.write_missing(store));  // epoch 1 ends: rank 0 had brought all of it
  for (int s = 0; s < 10; ++s) EXPECT_FALSE(store.try_get(keys::step_copy_key(s))) << s;
  for (int s = 5; s < 8; ++s) w.step(store, record(s, 2, /*epoch=*/2));
  ASSERT_TRUE(w.write_missing(store));
  for (int s = 5; s < 8; ++s) {
    const auto got = try_get_message<report::StepRecord>(store, keys::step_copy_key(s));
    ASSERT_TRUE(got) << s;
    EXPECT_EQ(got->epoch(), 2);
    EXPECT_EQ(got->loss(), 2);
  }
  store.erase({keys::step_copy_key(5)}, {});
  ASSERT_TRUE(w.write_missing(store));  // nothing kept since: nothing written
  EXPECT_FALSE(store.try_get(keys::step_copy_key(5)));
}

// etcd without quorum when the failure came: the records stay, and a later step tries again.
class RefusingStore : public HashStore {
 public:
  void set_all(const std::vector<std::pair<std::string, std::string>>& kvs) override {
    if (refuse) throw CommError("no quorum");
    HashStore::set_all(kvs);
  }
  bool refuse = true;
};

TEST(StepWitness, AWriteTheStoreRefusedIsTriedAgain) {
  RefusingStore store;
  StepWitness w;
  w.step(store, record(0, 1));
  EXPECT_FALSE(w.write_missing(store));
  EXPECT_TRUE(w.owed());
  store.refuse = false;
  // Tried again at a step at most once a second: here at the first step a second later.
  for (int s = 1; w.owed(); ++s) {
    w.step(store, record(s, 1));
    if (w.owed()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_LT(s, 200) << "never tried again";
  }
  EXPECT_TRUE(store.try_get(keys::step_copy_key(0)));
}

}  // namespace
}  // namespace keel
