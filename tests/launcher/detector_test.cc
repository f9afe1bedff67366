// The controller's failure Detector (launcher/controller/detector.h), through its public
// interface: an exit as an incident and the policy's input, a lost slot taking its ranks with
// it, the ranks' errors in the store (a communication error, new code on probation, an SDC
// verdict), what an abort's aftermath adds, and the progress it keeps.
#include "launcher/controller/detector.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <memory>

#include "launcher/controller/context.h"
#include "launcher/controller/membership.h"
#include "parallel/hash_store.h"
#include "parallel/tcp_store.h"
#include "proto/store_keys.h"
#include "proto/store_values.pb.h"

namespace keel {
namespace {

// Two ranks a slot; kill() records.
class TwoPerSlot : public RankHost {
 public:
  void spawn(int, const std::map<std::string, std::string>&) override {}
  void kill(int rank) override { killed.push_back(rank); }
  std::optional<RankExit> poll_exit() override { return std::nullopt; }
  void stop_all(int, std::chrono::milliseconds) override {}
  std::map<int, policy::Holdings> survey(const Topology&, bool) override { return {}; }
  void finish() override {}
  int slot_of(int rank) const override { return rank / 2; }
  std::vector<int> ranks_on(int slot) const override { return {2 * slot, 2 * slot + 1}; }
  std::vector<int> killed;
};

class DetectorTest : public testing::Test {
 protected:
  DetectorTest() {
    ctx.o = &options;
    ctx.host = &host;
    ctx.store = store;
    ctx.members = &members;
  }
  static RankExit exited(int rank, int code) {
    RankExit x;
    x.rank = rank;
    x.slot = rank / 2;
    x.status = (code & 0xff) << 8;
    return x;
  }

  TcpStoreServer server{"127.0.0.1", 0};
  std::shared_ptr<TcpStore> store = std::make_shared<TcpStore>("127.0.0.1", server.port());
  ControllerOptions options;
  JobMembership members{Topology(1, 1, 4), 4, SlotLayout{}};
  TwoPerSlot host;
  ControllerContext ctx;
  Detector detector{ctx, /*watch_progress=*/true};
};

TEST_F(DetectorTest, AnExitNamesItsRankAsTheCulprit) {
  const Detected d = detector.from_exit(exited(3, 1));
  EXPECT_EQ(d.found.kind(), "exit");
  EXPECT_EQ(d.found.slot(), 1);
  EXPECT_GT(d.found.detected_at(), 0);
  EXPECT_EQ(d.failure.kind, policy::FailureKind::kExit);
  EXPECT_EQ(d.failure.rule, "exit");
  EXPECT_EQ(d.failure.culprit, 3);
  EXPECT_EQ(d.failure.dead, std::set<int>{3});
}

TEST_F(DetectorTest, ALostSlotTakesAllItsRanks) {
  RankExit x;
  x.rank = 2;
  x.slot = 1;
  x.slot_lost = true;
  x.detail = "no heartbeat";
  const Detected d = detector.from_exit(x);
  EXPECT_EQ(d.found.kind(), "slot_loss");
  EXPECT_EQ(d.failure.rule, "heartbeat");
  EXPECT_EQ(d.failure.kind, policy::FailureKind::kSlotLoss);
  EXPECT_EQ(d.failure.lost_slots, std::set<int>{1});
  EXPECT_EQ(d.failure.dead, (std::set<int>{2, 3}));
}

// A lost slot is labelled by the injection that took it (a partition), but only once: the
// same machine lost again later (repaired and back, or silent in a takeover's wait) is a
// slot loss of its own, not that partition again (the soak once counted 10 partition
// incidents for 9 partitions).
TEST_F(DetectorTest, AnInjectionLabelsOneLossOnly) {
  ctx.store = std::make_shared<HashStore>();  // one that lists keys, as etcd's
  store::Injection in;
  in.set_kind("partition");
  in.set_rank(2);  // slot 1
  in.set_step(5);
  in.set_time(recovery::unix_now() - 10);
  set_message(*ctx.store, keys::injection_key(0), in);
  ctx.store->add(keys::kInjectCount, 1);
  RankExit x;
  x.rank = 2;
  x.slot = 1;
  x.slot_lost = true;
  const Detected first = detector.from_exit(x);
  EXPECT_EQ(first.found.kind(), "partition");
  EXPECT_EQ(first.failure.kind, policy::FailureKind::kPartition);
  EXPECT_EQ(first.found.injected_at(), in.time());
  // Its incident recorded, as the controller does (store_incident).
  set_message(*ctx.store, keys::incident_key(0), first.found);
  ctx.store->add(keys::kIncidentCount, 1);
  const Detected again = detector.from_exit(x);
  EXPECT_EQ(again.found.kind(), "slot_loss");
  EXPECT_EQ(again.failure.kind, policy::FailureKind::kSlotLoss);
  EXPECT_EQ(again.found.injected_at(), 0);
}

TEST_F(DetectorTest, CommunicationErrorsComeFromTheStore) {
  EXPECT_FALSE(detector.comm_error());
  store->add(keys::errors_key(0), 1);
  std::optional<Detected> d = detector.comm_error();
  ASSERT_TRUE(d);
  EXPECT_EQ(d->found.kind(), "comm_error");
  EXPECT_EQ(d->failure.kind, policy::FailureKind::kCommError);
  EXPECT_EQ(d->failure.culprit, -1);
  // New code on probation broke the training: the ranks said why.
  store::UpdateFailure f;
  f.set_why("loss jumped");
  set_message(*store, keys::update_failure_key(0), f);
  d = detector.comm_error();
  ASSERT_TRUE(d);
  EXPECT_EQ(d->found.kind(), "update_failure");
  EXPECT_EQ(d->found.detail(), "loss jumped");
  EXPECT_EQ(d->failure.rule, "probation");
}

TEST_F(DetectorTest, AnSdcVerdictNamesItsRankAndBoundsTheRestore) {
  store->add(keys::errors_key(0), 1);
  report::Incident verdict;
  verdict.set_kind("sdc");
  verdict.set_rank(2);
  verdict.set_rule("replica_mismatch");
  verdict.set_verified_step(40);
  set_message(*store, keys::sdc_verdict_key(0), verdict);
  const std::optional<Detected> d = detector.comm_error();
  ASSERT_TRUE(d);
  EXPECT_EQ(d->failure.kind, policy::FailureKind::kSdc);
  EXPECT_EQ(d->failure.culprit, 2);
  EXPECT_EQ(d->failure.rule, "replica_mismatch");
  EXPECT_EQ(d->found.slot(), 1);
  // The culprit and the rule are the failure's only: the record derives them from it.
  EXPECT_EQ(d->found.rank(), 0);  // cleared
  EXPECT_TRUE(d->found.rule().empty());
  EXPECT_EQ(d->failure.restore_at_most, std::optional<int64_t>(40));
}

// A peer's communication error came first; the exit that follows names the culprit, and a
// rank that never answers the abort is killed and named hung.
TEST_F(DetectorTest, AnAbortsAftermathNamesTheCulprit) {
  store->add(keys::errors_key(0), 1);
  Detected d = *detector.comm_error();
  RankExit x = exited(1, 0);
  x.status = SIGKILL;
  detector.fold_exit(&d, x);
  EXPECT_EQ(d.found.kind(), "crash");
  EXPECT_EQ(d.failure.culprit, 1);
  EXPECT_EQ(d.failure.kind, policy::FailureKind::kCrash);
  EXPECT_TRUE(d.failure.dead.count(1));

  Detected h = *detector.comm_error();
  detector.fold_unanswered(&h, 2, 500);
  EXPECT_EQ(host.killed, std::vector<int>{2});
  EXPECT_EQ(h.found.kind(), "hang");
  EXPECT_EQ(h.failure.rule, "abort_deadline");
  EXPECT_EQ(h.failure.culprit, 2);
  EXPECT_NE(h.found.detail().find("did not answer the abort within 500 ms"), std::string::npos);
}

TEST_F(DetectorTest, ProgressIsKeptPerEpoch) {
  control::WorkerProgress p;
  p.set_rank(0);
  p.set_step(12);
  p.set_step_s(0.5);
  detector.on_progress(p);
  p.set_rank(1);
  p.set_step(13);
  p.set_step_s(0.7);
  detector.on_progress(p);
  EXPECT_EQ(detector.ahead(), 13);
  EXPECT_DOUBLE_EQ(detector.median_step_s(), 0.7);
  detector.forget(1);
  EXPECT_EQ(detector.progress().size(), 1u);
  detector.new_epoch(20);
  EXPECT_TRUE(detector.progress().empty());
  EXPECT_EQ(detector.ahead(), 20);
  EXPECT_EQ(detector.min_step(), -1);
}

}  // namespace
}  // namespace keel
