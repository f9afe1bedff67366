// The UpdateWatcher (launcher/worker/update_watcher.h) against an in-memory store, as the
// controller's update manager drives it: a plan is checked and answered
// (store::UpdateCheck), the decision (store::UpdateDecision) makes the checked plugin due
// before its step, once; a refused plan or a refused decision switches nothing. And the
// Probation that holds new code to the loss before it.
#include "launcher/worker/update_watcher.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "parallel/hash_store.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "runtime/check.h"
#include "tests/test_paths.h"

namespace keel {
namespace {

using namespace std::chrono_literals;

// The check of the watcher's test: a plan naming "good" gets the test plugin, any other
// plugin does not fit.
std::shared_ptr<Plugin> check(const report::Update& plan, int) {
  if (plan.plugin() != "good") throw InputError(plan.plugin() + " does not fit");
  return Plugin::load(test::bin_dir() + "/libkeel_gpt.so");
}

report::Update plan(const std::string& plugin, report::UpdateOutcome outcome = report::pending) {
  report::Update u;
  u.set_plugin(plugin);
  u.set_hash("h");
  u.set_outcome(outcome);
  return u;
}

// Polls take_due(step) until it returns something or `wait` passes.
std::optional<UpdateWatcher::Due> due_within(UpdateWatcher& w, int64_t step,
                                             std::chrono::seconds wait) {
  const auto end = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < end) {
    if (auto d = w.take_due(step)) return d;
    std::this_thread::sleep_for(10ms);
  }
  return std::nullopt;
}

class UpdateWatcherTest : public testing::Test {
 protected:
  std::shared_ptr<HashStore> store = std::make_shared<HashStore>();
  UpdateWatcher watcher{[s = store]() -> std::shared_ptr<Store> { return s; }, 3, check};
};

TEST_F(UpdateWatcherTest, ACheckedPlanIsDueBeforeItsStepOnce) {
  watcher.start();
  set_message(*store, keys::update_key(0), plan("good"));
  const auto answer = get_message<store::UpdateCheck>(*store, keys::update_check_key(0, 3), 10s);
  EXPECT_TRUE(answer.ok()) << answer.why();
  EXPECT_FALSE(watcher.take_due(5).has_value());  // no decision yet
  store::UpdateDecision d;
  d.set_apply_before_step(5);
  set_message(*store, keys::update_apply_key(0), d);
  EXPECT_FALSE(due_within(watcher, 4, 2s).has_value());  // before its step
  const auto due = due_within(watcher, 5, 10s);
  ASSERT_TRUE(due.has_value());
  EXPECT_EQ(due->id, 0);
  EXPECT_NE(due->plugin, nullptr);
  EXPECT_FALSE(watcher.take_due(6).has_value());  // once
}

TEST_F(UpdateWatcherTest, APluginThatDoesNotFitIsRefusedWithTheRankAndWhy) {
  watcher.set_rank(5);  // the job's layout changed: the rank answers under its new id
  watcher.start();
  set_message(*store, keys::update_key(0), plan("bad"));
  const auto answer = get_message<store::UpdateCheck>(*store, keys::update_check_key(0, 5), 10s);
  EXPECT_FALSE(answer.ok());
  EXPECT_EQ(answer.why(), "rank 5: bad does not fit");
  // Even a decision to apply switches nothing: this rank has no checked plugin.
  store::UpdateDecision d;
  d.set_apply_before_step(2);
  set_message(*store, keys::update_apply_key(0), d);
  // The next plan is followed: the watcher went on.
  set_message(*store, keys::update_key(1), plan("good"));
  get_message<store::UpdateCheck>(*store, keys::update_check_key(1, 5), 10s);
  EXPECT_FALSE(watcher.take_due(2).has_value());
}

TEST_F(UpdateWatcherTest, RefusedPlansAndRefusalsSwitchNothing) {
  // Asked before the process started: in the plugin it adopted, not followed.
  set_message(*store, keys::update_key(0), plan("good"));
  store->add(keys::kUpdateCount, 1);
  watcher.start();
  // Refused by the controller already: nothing to check.
  set_message(*store, keys::update_key(1), plan("good", report::refused));
  // Checked, then refused (another rank could not load it).
  set_message(*store, keys::update_key(2), plan("good"));
  const auto answer = get_message<store::UpdateCheck>(*store, keys::update_check_key(2, 3), 10s);
  EXPECT_TRUE(answer.ok());
  EXPECT_FALSE(store->try_get(keys::update_check_key(0, 3)).has_value());
  EXPECT_FALSE(store->try_get(keys::update_check_key(1, 3)).has_value());
  store::UpdateDecision d;
  d.set_refused("rank 1: no");
  set_message(*store, keys::update_apply_key(2), d);
  EXPECT_FALSE(due_within(watcher, 100, 2s).has_value());
  watcher.stop();
}

TEST(Probation, ALossJumpAfterAnUpdateFailsItsCodeOnlyWhileOnProbation) {
  Probation p(/*probation_steps=*/3, /*max_loss_jump=*/1.0f);
  EXPECT_FALSE(p.after_step(0, 2.0).has_value());
  EXPECT_FALSE(p.after_step(1, 2.0).has_value());
  p.start(2);  // the limit: (1 + 1) x 2
  EXPECT_TRUE(p.on(2));
  EXPECT_FALSE(p.after_step(2, 3.9).has_value());
  const std::optional<std::string> why = p.after_step(3, 5.0);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why,
            "loss 5 at step 4 is above 4 = (1 + update.max_loss_jump 1) x the mean loss "
            "before the update");
  EXPECT_FALSE(p.on(5));  // three steps after it took over: trusted
  EXPECT_FALSE(p.after_step(5, 50.0).has_value());
  p.start(6);
  p.end();  // a rollback: judged again only when an update is applied
  EXPECT_FALSE(p.on(6));
  EXPECT_FALSE(p.after_step(6, 500.0).has_value());
}

TEST(Probation, OnlyTheNewestLossesSetTheLimit) {
  Probation p(10, 0.5f);
  for (int s = 0; s < 20; ++s) p.after_step(s, s < 10 ? 100.0 : 1.0);
  p.start(20);  // the mean of the newest ten is 1: the limit 1.5
  EXPECT_FALSE(p.after_step(20, 1.49).has_value());
  EXPECT_TRUE(p.after_step(21, 1.6).has_value());
}

}  // namespace
}  // namespace keel
