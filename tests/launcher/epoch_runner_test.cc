// The EpochRunner (launcher/worker/epoch_runner.h) with an in-memory store standing in for
// the controller: joining an epoch in order, and an epoch that fails while it is being built
// (a peer died in the rendezvous), reported as the recovery protocol says, and followed by
// the next epoch the controller decides on.
#include "launcher/worker/epoch_runner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "parallel/hash_store.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"

namespace keel {
namespace {

using namespace std::chrono_literals;

// The steps record what the runner asked for, in order.
struct Recorder {
  std::vector<std::string> calls;
  int fail_rendezvous = 0;  // this many rendezvous fail (a CommError) before one stands
  int64_t steps = 7;
  std::vector<int64_t> restore_steps;  // of the Rebuilds load() got (-100: none)

  EpochRunner::Steps steps_for(EpochRunner** runner) {
    EpochRunner::Steps st;
    st.take_rebuild = [this](const membership::Rebuild& rb) {
      calls.push_back("take_rebuild " + std::to_string(rb.restore_step()));
    };
    st.before_rendezvous = [this, runner] {
      calls.push_back("before_rendezvous " + std::to_string((*runner)->epoch()));
    };
    st.make_groups = [this, runner](const std::atomic<bool>*) {
      calls.push_back("make_groups " + std::to_string((*runner)->epoch()));
      if (fail_rendezvous > 0) {
        --fail_rendezvous;
        throw CommError("peer 3 went away in the rendezvous");
      }
      return ProcessGroups{};
    };
    st.load = [this](const membership::Rebuild* rb) {
      calls.push_back("load");
      restore_steps.push_back(rb ? rb->restore_step() : -100);
    };
    st.steps_done = [this] { return steps; };
    return st;
  }
};

membership::Rebuild rebuild(int64_t restore_step) {
  membership::Rebuild rb;
  rb.set_restore_step(restore_step);
  rb.mutable_membership()->set_tp(1);
  rb.mutable_membership()->set_pp(1);
  rb.mutable_membership()->set_dp(2);
  return rb;
}

TEST(EpochRunner, WithoutAControllerJoinsOnceAndThrowsAFailure) {
  Recorder rec;
  EpochRunner* self = nullptr;
  EpochRunner runner(rec.steps_for(&self));
  self = &runner;
  runner.join(0, nullptr);
  EXPECT_EQ(runner.epoch(), 0);
  EXPECT_EQ(rec.calls, (std::vector<std::string>{"before_rendezvous 0", "make_groups 0", "load"}));
  EXPECT_EQ(rec.restore_steps, std::vector<int64_t>{-100});
  ASSERT_NE(runner.groups().get(), nullptr);

  rec.fail_rendezvous = 1;
  EXPECT_THROW(runner.join(1, nullptr), CommError);
}

TEST(EpochRunner, AnEpochThatFailsWhileBuiltIsReportedAndTheNextOneJoined) {
  auto store = std::make_shared<HashStore>();
  RecoveryClient recovery([store]() -> std::shared_ptr<Store> { return store; }, /*rank=*/2);
  Recorder rec;
  rec.fail_rendezvous = 1;
  EpochRunner* self = nullptr;
  EpochRunner runner(rec.steps_for(&self));
  self = &runner;
  runner.set_recovery(&recovery);
  // The controller's side: it aborts epoch 3 and decides on epoch 4 (restore step 6).
  store::Abort abort;
  abort.set_reason("rank 3 died");
  set_message(*store, keys::abort_key(4), abort);
  set_message(*store, keys::rebuild_key(4), rebuild(6));

  const membership::Rebuild start = rebuild(5);
  runner.join(3, &start);
  recovery.stop_watch();
  EXPECT_EQ(runner.epoch(), 4);
  EXPECT_EQ(rec.calls, (std::vector<std::string>{"take_rebuild 5", "before_rendezvous 3",
                                                 "make_groups 3", "take_rebuild 6",
                                                 "before_rendezvous 4", "make_groups 4", "load"}));
  EXPECT_EQ(rec.restore_steps, std::vector<int64_t>{6});
  // The protocol's keys: the error (unless the abort came first: here it was already set, so
  // the rank only acknowledges), the ack with its steps, and its restore in epoch 4.
  const auto ack = get_message<membership::Ack>(*store, keys::ack_key(4, 2), 1s);
  EXPECT_EQ(ack.steps_completed(), 7);
  EXPECT_EQ(ack.step_in_flight(), 7);
  EXPECT_TRUE(try_get_message<store::Time>(*store, keys::restored_key(4, 2)).has_value());
  EXPECT_FALSE(store->try_get(keys::restored_key(3, 2)).has_value());
}

TEST(EpochRunner, AFailedStepIsReportedWithItsStepAndTheNextEpochJoined) {
  auto store = std::make_shared<HashStore>();
  RecoveryClient recovery([store]() -> std::shared_ptr<Store> { return store; }, /*rank=*/0);
  Recorder rec;
  EpochRunner* self = nullptr;
  EpochRunner runner(rec.steps_for(&self));
  self = &runner;
  runner.set_recovery(&recovery);
  runner.join(0, nullptr);
  EXPECT_FALSE(store->try_get(keys::restored_key(0, 0)).has_value());  // the job's start
  // The controller's side answers the rank's error, as it would: an abort set before the
  // error would make the rank only acknowledge (the watcher may see it first).
  std::thread controller([&] {
    store->get(keys::error_key(0, 0), 10s);
    set_message(*store, keys::abort_key(1), store::Abort{});
    set_message(*store, keys::rebuild_key(1), rebuild(7));
  });
  bool settled = false;
  runner.fail(/*step=*/7, "sdc: rank 1 differs", [&] { settled = true; });
  controller.join();
  recovery.stop_watch();
  EXPECT_TRUE(settled);
  EXPECT_EQ(runner.epoch(), 1);
  const auto error = try_get_message<store::RankError>(*store, keys::error_key(0, 0));
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->what(), "sdc: rank 1 differs");
  EXPECT_EQ(store->add(keys::errors_key(0), 0), 1);
  EXPECT_EQ(get_message<membership::Ack>(*store, keys::ack_key(1, 0), 1s).step_in_flight(), 7);
  EXPECT_EQ(rec.restore_steps, (std::vector<int64_t>{-100, 7}));
  EXPECT_TRUE(try_get_message<store::Time>(*store, keys::restored_key(1, 0)).has_value());
}

}  // namespace
}  // namespace keel
