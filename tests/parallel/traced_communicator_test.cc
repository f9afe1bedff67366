// Call tracing and collective numbering (parallel/traced_communicator.h): collectives are
// numbered per group and point-to-point calls are not, a call's number shows while it runs,
// a failed call leaves the last finished one, a rebuild restarts the numbers (and calls of
// the old epoch no longer touch them), two threads on two groups count without a lost
// update, and two ranks on real sockets agree on their numbers.
#include "parallel/traced_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "parallel/hash_store.h"
#include "parallel/socket_communicator.h"

namespace keel {
namespace {

using namespace std::chrono_literals;

// A communicator that does nothing but run `during` inside every call (so a test can look
// at the activity then) and throw if told to.
class FakeComm : public Communicator {
 public:
  std::function<void()> during;
  bool fail = false;

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  Millis default_timeout() const override { return Millis(1000); }
  void all_reduce(float*, size_t, ReduceOp, Millis) override { call(); }
  void reduce_scatter(float*, size_t, Millis) override { call(); }
  void all_gather(float*, size_t, Millis) override { call(); }
  void broadcast(void*, size_t, int, Millis) override { call(); }
  void send(const void*, size_t, int, uint32_t, Millis) override { call(); }
  void recv(void*, size_t, int, uint32_t, Millis) override { call(); }
  void send_recv(const void*, size_t, int, void*, size_t, int, uint32_t, Millis) override {
    call();
  }
  void barrier(Millis) override { call(); }
  void abort() override {}
  bool aborted() const override { return false; }
  CommStats stats() const override { return {}; }

 private:
  void call() {
    if (during) during();
    if (fail) throw CommAborted("fake: aborted");
  }
  std::string name_ = "fake";
};

// Five fake groups, traced; `fakes` keeps a pointer to each (world, tp, pp, dp, emb).
struct Traced {
  ProcessGroups groups;
  std::array<FakeComm*, kCommGroups> fakes{};
  explicit Traced(const std::shared_ptr<CommActivity>& a) {
    std::array<std::unique_ptr<Communicator>*, kCommGroups> comms = {
        &groups.world, &groups.tp, &groups.pp, &groups.dp, &groups.emb};
    for (int i = 0; i < kCommGroups; ++i) {
      auto f = std::make_unique<FakeComm>();
      fakes[size_t(i)] = f.get();
      *comms[size_t(i)] = std::move(f);
    }
    trace_communicators(groups, a);
  }
};

GroupSeq seq_of(const CommActivity& a, CommGroup g) {
  return a.groups()[size_t(g)];
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(TracedCommunicator, NumbersCollectivesPerGroupButNotPointToPoint) {
  auto a = std::make_shared<CommActivity>();
  Traced t(a);
  float x[4] = {};
  EXPECT_STREQ(comm_group_name(CommGroup::kTp), "tp");
  EXPECT_STREQ(comm_group_name(CommGroup::kEmb), "emb");

  t.groups.world->all_reduce(x, 1);
  t.groups.tp->reduce_scatter(x, 1);
  // Inside tp's second collective: #2 entered, #1 finished, since its start (a time stamp
  // taken between the call and this look, by the order of events).
  bool looked = false;
  double called_at = 0;
  t.fakes[1]->during = [&] {
    GroupSeq g = seq_of(*a, CommGroup::kTp);
    EXPECT_EQ(g.group, CommGroup::kTp);
    EXPECT_EQ(g.entered, 2);
    EXPECT_EQ(g.finished, 1);
    EXPECT_GE(g.since, called_at);
    EXPECT_LE(g.since, unix_now());
    EXPECT_TRUE(a->in_call());
    EXPECT_EQ(a->since(), g.since);
    looked = true;
  };
  called_at = unix_now();
  t.groups.tp->all_gather(x, 1);
  EXPECT_TRUE(looked);
  t.groups.dp->broadcast(x, 4, 0);
  t.groups.dp->barrier();
  t.groups.emb->all_reduce(x, 1, ReduceOp::kMax);

  // Point-to-point: inside a call, but no number.
  looked = false;
  t.fakes[2]->during = [&] {
    EXPECT_TRUE(a->in_call());
    EXPECT_EQ(seq_of(*a, CommGroup::kPp).entered, 0);
    looked = true;
  };
  t.groups.pp->send(x, 4, 1, 7);
  t.groups.pp->recv(x, 4, 1, 7);
  t.groups.pp->send_recv(x, 4, 1, x, 4, 1, 7);
  EXPECT_TRUE(looked);

  EXPECT_FALSE(a->in_call());
  EXPECT_EQ(a->since(), 0);
  auto g = a->groups();
  const int64_t want[kCommGroups] = {1, 2, 0, 2, 1};  // world, tp, pp, dp, emb
  for (int i = 0; i < kCommGroups; ++i) {
    EXPECT_EQ(g[size_t(i)].group, CommGroup(i));
    EXPECT_EQ(g[size_t(i)].finished, want[i]) << comm_group_name(CommGroup(i));
    EXPECT_EQ(g[size_t(i)].entered, 0);
    EXPECT_EQ(g[size_t(i)].since, 0);
  }
}

TEST(TracedCommunicator, AFailedCallIsLeftButNotFinished) {
  auto a = std::make_shared<CommActivity>();
  Traced t(a);
  float x = 0;
  t.groups.dp->all_reduce(&x, 1);
  t.fakes[3]->fail = true;
  EXPECT_THROW(t.groups.dp->all_reduce(&x, 1), CommAborted);
  GroupSeq g = seq_of(*a, CommGroup::kDp);
  EXPECT_EQ(g.entered, 0);
  EXPECT_EQ(g.finished, 1);
  EXPECT_FALSE(a->in_call());
}

TEST(TracedCommunicator, ARebuildRestartsTheNumbersAndOldCallsNoLongerCount) {
  auto a = std::make_shared<CommActivity>();
  auto old = std::make_unique<Traced>(a);
  float x = 0;
  for (int i = 0; i < 3; ++i) old->groups.tp->all_reduce(&x, 1);
  EXPECT_EQ(seq_of(*a, CommGroup::kTp).finished, 3);

  // A call of the old epoch still runs (on another thread) while the groups are rebuilt.
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false, release = false;
  old->fakes[1]->during = [&] {
    std::unique_lock<std::mutex> l(mu);
    inside = true;
    cv.notify_all();
    cv.wait(l, [&] { return release; });
  };
  std::thread straggler([&] { old->groups.tp->all_reduce(&x, 1); });
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, 10s, [&] { return inside; }));
  }
  EXPECT_EQ(seq_of(*a, CommGroup::kTp).entered, 4);

  Traced fresh(a);
  GroupSeq g = seq_of(*a, CommGroup::kTp);
  EXPECT_EQ(g.entered, 0);
  EXPECT_EQ(g.finished, 0);
  EXPECT_TRUE(a->in_call());  // the straggler is still in a call
  fresh.groups.tp->all_reduce(&x, 1);
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  straggler.join();
  g = seq_of(*a, CommGroup::kTp);
  EXPECT_EQ(g.entered, 0);
  EXPECT_EQ(g.finished, 1);  // the new epoch's #1, not the straggler's #4
  EXPECT_FALSE(a->in_call());
}

TEST(TracedCommunicator, TwoThreadsOnTwoGroupsLoseNoCount) {
  auto a = std::make_shared<CommActivity>();
  Traced t(a);
  constexpr int kCalls = 20000;
  auto hammer = [&](Communicator* c) {
    float x = 0;
    for (int i = 0; i < kCalls; ++i) c->all_reduce(&x, 1);
  };
  std::thread dp(hammer, t.groups.dp.get());
  std::thread tp(hammer, t.groups.tp.get());
  // Meanwhile a reader (the progress reporter) never sees a number go backwards.
  int64_t last = 0;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (seq_of(*a, CommGroup::kDp).finished < kCalls &&
         std::chrono::steady_clock::now() < deadline) {
    int64_t now = seq_of(*a, CommGroup::kDp).finished;
    EXPECT_GE(now, last);
    last = now;
  }
  dp.join();
  tp.join();
  EXPECT_EQ(seq_of(*a, CommGroup::kDp).finished, kCalls);
  EXPECT_EQ(seq_of(*a, CommGroup::kTp).finished, kCalls);
  EXPECT_FALSE(a->in_call());
}

TEST(TracedCommunicator, StayInsideLastMakesTheRankLookInsideItsLastCollective) {
  auto a = std::make_shared<CommActivity>();
  Traced t(a);
  float x = 0;
  a->stay_inside_last(CommGroup::kTp);  // nothing finished yet: nothing to stay inside
  EXPECT_FALSE(a->in_call());
  double started = 0;
  t.fakes[1]->during = [&] { started = seq_of(*a, CommGroup::kTp).since; };
  t.groups.tp->all_reduce(&x, 1);
  t.groups.tp->all_reduce(&x, 1);
  a->stay_inside_last(CommGroup::kTp);
  GroupSeq g = seq_of(*a, CommGroup::kTp);
  EXPECT_EQ(g.entered, 2);
  EXPECT_EQ(g.finished, 1);
  EXPECT_EQ(g.since, started);
  EXPECT_TRUE(a->in_call());
  EXPECT_EQ(a->since(), started);
}

TEST(TracedCommunicator, TwoRanksOnSocketsAgreeOnTheirNumbers) {
  auto store = std::make_shared<HashStore>();
  constexpr int kRounds = 5;
  std::array<std::shared_ptr<CommActivity>, 2> act = {std::make_shared<CommActivity>(),
                                                      std::make_shared<CommActivity>()};
  std::array<float, 2> sums{};
  auto rank = [&](int r) {
    ProcessGroups g;
    g.dp = make_socket_communicator(store, {.name = "0/dp", .rank = r, .size = 2, .timeout = 20s});
    trace_communicators(g, act[size_t(r)]);
    for (int i = 0; i < kRounds; ++i) {
      float x = float(r + 1);
      g.dp->all_reduce(&x, 1);
      sums[size_t(r)] += x;
      g.dp->send_recv(&x, 4, 1 - r, &x, 4, 1 - r, 3);  // not numbered
    }
    g.dp->barrier();
  };
  std::thread r0(rank, 0), r1(rank, 1);
  r0.join();
  r1.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sums[size_t(r)], 3.0f * kRounds);
    GroupSeq s = seq_of(*act[size_t(r)], CommGroup::kDp);
    EXPECT_EQ(s.finished, kRounds + 1);  // the all-reduces and the barrier
    EXPECT_EQ(s.entered, 0);
    EXPECT_EQ(seq_of(*act[size_t(r)], CommGroup::kWorld).finished, 0);  // absent group
  }
}

}  // namespace
}  // namespace keel
