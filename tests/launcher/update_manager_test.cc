// The controller's part of a hot update (launcher/controller/update_manager.h), through its
// public interface and the store protocol the ranks' update watchers answer: a file that is no
// plugin is refused and still published, a rank's refusal refuses the update for all, an
// accepted one applies ahead of every rank and goes on probation, a failure on probation rolls
// it back, and a lazy one waits for the next recovery's Rebuild.
#include "launcher/controller/update_manager.h"

#include <gtest/gtest.h>

#include <memory>

#include "launcher/controller/context.h"
#include "launcher/controller/membership.h"
#include "parallel/tcp_store.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"
#include "test_paths.h"

namespace keel {
namespace {

class NoRanks : public RankHost {
 public:
  void spawn(int, const std::map<std::string, std::string>&) override {}
  void kill(int) override {}
  std::optional<RankExit> poll_exit() override { return std::nullopt; }
  void stop_all(int, std::chrono::milliseconds) override {}
  std::map<int, policy::Holdings> survey(const Topology&, bool) override { return {}; }
  void finish() override {}
};

class UpdateManagerTest : public testing::Test {
 protected:
  UpdateManagerTest() {
    options.cfg.mutable_model()->set_plugin(plugin);
    options.cfg.mutable_update()->set_probation_steps(10);
    ctx.o = &options;
    ctx.host = &host;
    ctx.store = store;
    ctx.members = &members;
  }

  control::UpdateReply request(bool lazy = false, int64_t command = 0) {
    control::UpdateRequest rq;
    rq.set_plugin(plugin);
    rq.set_lazy(lazy);
    control::UpdateReply r;
    updates.request(rq, /*completed=*/0, command, &r);
    return r;
  }
  // Update 0, checked by both ranks, switched to by both at `step`: then on probation.
  void apply_on_both_ranks(int64_t step) {
    check(0, 0, true);
    check(0, 1, true);
    updates.poll(0);
    store::Step s;
    s.set_step(step);
    set_message(*store, keys::update_applied_key(0, 0), s);
    set_message(*store, keys::update_applied_key(0, 1), s);
    updates.poll(step);
  }
  void check(int64_t n, int rank, bool ok, const std::string& why = "") {
    store::UpdateCheck c;
    c.set_ok(ok);
    c.set_why(why);
    set_message(*store, keys::update_check_key(n, rank), c);
  }
  store::UpdateDecision decision(int64_t n) {
    return get_message<store::UpdateDecision>(*store, keys::update_apply_key(n),
                                              std::chrono::milliseconds(100));
  }
  report::Update record(int64_t n) {
    return get_message<report::Update>(*store, keys::update_record_key(n),
                                       std::chrono::milliseconds(100));
  }

  const std::string plugin = test::bin_dir() + "/libkeel_gpt.so";
  TcpStoreServer server{"127.0.0.1", 0};
  std::shared_ptr<TcpStore> store = std::make_shared<TcpStore>("127.0.0.1", server.port());
  ControllerOptions options;
  JobMembership members{Topology(1, 1, 2), 2, SlotLayout{}};
  NoRanks host;
  ControllerContext ctx;
  UpdateManager updates{ctx};
};

TEST_F(UpdateManagerTest, AFileThatIsNoPluginIsRefusedAndPublished) {
  control::UpdateRequest rq;
  rq.set_plugin("/nonexistent/libnothing.so");
  control::UpdateReply r;
  updates.request(rq, /*completed=*/0, /*command=*/0, &r);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.id(), 0);
  EXPECT_EQ(r.message().rfind("refused: ", 0), 0u) << r.message();
  EXPECT_EQ(store->add(keys::kUpdateCount, 0), 1);
  EXPECT_EQ(record(0).outcome(), report::refused);
  // Nothing is in progress: the next request is taken.
  EXPECT_TRUE(request().ok());
}

// --at-step at a step the job has completed, or past its last: refused before anything is
// published, as keel-ctl inject refuses a step that has passed.
TEST_F(UpdateManagerTest, AnAtStepThatHasPassedIsRefused) {
  options.cfg.mutable_train()->set_steps(100);
  control::UpdateRequest rq;
  rq.set_plugin(plugin);
  rq.set_at_step(20);
  control::UpdateReply r;
  updates.request(rq, /*completed=*/30, /*command=*/0, &r);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.message(),
            "--at-step 20: step 20 has passed: the job has completed 30 step(s); give "
            "--at-step 31 or later");
  rq.set_at_step(100);
  updates.request(rq, /*completed=*/30, /*command=*/0, &r);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.message(),
            "--at-step 100: the job has 100 steps (train.steps); give a step below it");
  EXPECT_EQ(store->add(keys::kUpdateCount, 0), 0) << "a refused --at-step published a plan";
  rq.set_at_step(31);
  updates.request(rq, /*completed=*/30, /*command=*/0, &r);
  EXPECT_TRUE(r.ok()) << r.message();
}

TEST_F(UpdateManagerTest, ARanksRefusalRefusesTheUpdateForAll) {
  ASSERT_TRUE(request().ok());
  EXPECT_FALSE(request().ok());  // one at a time
  check(0, 0, true);
  updates.poll(5);
  EXPECT_FALSE(store->try_get(keys::update_apply_key(0)));  // rank 1 has not checked yet
  check(0, 1, false, "its state does not fit");
  updates.poll(5);
  const store::UpdateDecision d = decision(0);
  ASSERT_EQ(d.decision_case(), store::UpdateDecision::kRefused);
  EXPECT_EQ(d.refused(), "its state does not fit");
  EXPECT_EQ(record(0).outcome(), report::refused);
  EXPECT_FALSE(updates.can_roll_back());
}

TEST_F(UpdateManagerTest, AnAcceptedUpdateAppliesAheadOfEveryRankThenPassesProbation) {
  ASSERT_TRUE(request().ok());
  check(0, 0, true);
  check(0, 1, true);
  updates.poll(7);
  const store::UpdateDecision d = decision(0);
  ASSERT_EQ(d.decision_case(), store::UpdateDecision::kApplyBeforeStep);
  EXPECT_EQ(d.apply_before_step(), 10);  // three steps ahead of the newest report
  store::Step s;
  s.set_step(9);
  set_message(*store, keys::update_applied_key(0, 0), s);
  updates.poll(9);
  EXPECT_EQ(updates.last_applied_step(), -1);  // rank 1 has not switched
  set_message(*store, keys::update_applied_key(0, 1), s);
  updates.poll(9);
  EXPECT_EQ(updates.last_applied_step(), 9);
  EXPECT_EQ(record(0).outcome(), report::applied);
  const auto current = try_get_message<store::Plugin>(*store, keys::kPluginCurrent);
  ASSERT_TRUE(current);
  EXPECT_EQ(current->path(), plugin);
  EXPECT_FALSE(current->hash().empty());
  EXPECT_TRUE(updates.in_probation(12));
  EXPECT_TRUE(updates.can_roll_back());
  EXPECT_NE(updates.progress_label().find(" | plugin "), std::string::npos);
  updates.end_probation(30);
  EXPECT_FALSE(updates.in_probation(12));
  EXPECT_TRUE(request().ok());  // the passed one no longer blocks the next
}

TEST_F(UpdateManagerTest, AFailureOnProbationRollsBack) {
  ASSERT_TRUE(request().ok());
  apply_on_both_ranks(3);
  ASSERT_TRUE(updates.in_probation(5));
  Detected d;
  d.found.set_detail("loss jumped");
  membership::Rebuild rb;
  updates.rollback(&d, &rb);
  EXPECT_EQ(d.failure.restore_at_most, std::optional<int64_t>(3));
  EXPECT_EQ(d.found.kind(), "rollback");
  EXPECT_FALSE(rb.plugin_hash().empty());
  EXPECT_EQ(record(0).outcome(), report::rolled_back);
  EXPECT_FALSE(updates.in_probation(5));
  EXPECT_FALSE(updates.can_roll_back());
}

TEST_F(UpdateManagerTest, ALazyUpdateWaitsForTheNextRecovery) {
  membership::Rebuild rb;
  ASSERT_TRUE(request(/*lazy=*/true).ok());
  EXPECT_FALSE(updates.staged(&rb));  // not checked yet
  check(0, 0, true);
  check(0, 1, true);
  updates.poll(4);
  EXPECT_FALSE(store->try_get(keys::update_apply_key(0)));  // no step: the recovery takes it
  ASSERT_TRUE(updates.staged(&rb));
  EXPECT_EQ(rb.plugin_path(), plugin);
  updates.applied(6);
  EXPECT_EQ(updates.last_applied_step(), 6);
  EXPECT_FALSE(updates.staged(&rb));
  EXPECT_TRUE(updates.in_probation(8));
}

// A new leader goes on with an update on probation (issue 42): the update's state is part of
// the job's record (to_proto), and a manager restored from it rolls the update back on a
// failure, as the one that applied it would have; a command's update is found by its number.
TEST_F(UpdateManagerTest, ANewLeaderRollsBackAnUpdateOnProbation) {
  const control::UpdateReply r = request(/*lazy=*/false, /*command=*/7);
  ASSERT_TRUE(r.ok()) << r.message();
  apply_on_both_ranks(3);
  ASSERT_TRUE(updates.in_probation(5));
  const state::UpdateState saved = updates.to_proto();
  EXPECT_EQ(saved.phase(), state::UpdateState::probation);

  UpdateManager next(ctx);  // the next leader's, from the record alone
  EXPECT_FALSE(next.in_probation(5));
  next.restore(saved);
  EXPECT_TRUE(next.in_probation(5));
  EXPECT_TRUE(next.can_roll_back());
  EXPECT_EQ(next.last_applied_step(), 3);
  EXPECT_TRUE(next.published_by(7));
  EXPECT_FALSE(next.published_by(8));
  Detected d;
  d.found.set_detail("a rank crashed");
  membership::Rebuild rb;
  next.rollback(&d, &rb);
  EXPECT_EQ(d.failure.restore_at_most, std::optional<int64_t>(3));
  EXPECT_EQ(rb.plugin_hash(), record(0).previous_hash());
  EXPECT_EQ(record(0).outcome(), report::rolled_back);
  EXPECT_EQ(next.to_proto().phase(), state::UpdateState::none);
}

}  // namespace
}  // namespace keel
