// group_stacks through every branch, with made-up stacks in the format of
// launcher/stack_capture.h.
#include "robust/stack_groups.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace keel {
namespace {

using Frames = std::vector<std::string>;

// The outer frames every worker's main thread has.
const Frames kStart = {"keel::StepLoop::run()+0x1f2 (keel-worker)",
                       "keel::Worker::run()+0x88 (keel-worker)", "main+0x51 (keel-worker)",
                       "__libc_start_main+0x85 (libc.so.6)", "_start+0x21 (keel-worker)"};

Frames with_start(Frames inner) {
  inner.insert(inner.end(), kStart.begin(), kStart.end());
  return inner;
}

// Waiting in the data-parallel all-reduce; `in_poll` picks the innermost library frame,
// which differs between ranks by timing only.
Frames all_reduce(bool in_poll, int offset = 0x40) {
  return with_start({in_poll ? "__poll+0x4f (libc.so.6)" : "recv+0x2a (libc.so.6)",
                     "keel::SocketCommunicator::all_reduce(float*, unsigned long)+0x" +
                         std::to_string(offset) + " (keel-worker)",
                     "keel::GradSync::finish()+0x12 (keel-worker)"});
}

Frames spinning(int offset) {
  return with_start(
      {"keel::(anonymous namespace)::spin_forever()+0x" + std::to_string(offset) + " (keel-worker)",
       "keel::FaultInjector::before_step(long)+0x1a0 (keel-worker)"});
}

Frames in_gemm() {
  return with_start({"sgemm_kernel+0x300 (libopenblas.so.0)",
                     "keel::CpuBackend::matmul(keel::Tensor const&)+0x90 (keel-worker)"});
}

Frames helper() {
  return {"__poll+0x4f (libc.so.6)", "keel::ProgressReporter::loop()+0x77 (keel-worker)",
          "start_thread+0x2f2 (libc.so.6)", "clone3+0x2f (libc.so.6)"};
}

RankThreads rank(int r, Frames main_frames, bool with_helper = true) {
  RankThreads t;
  t.rank = r;
  t.threads.push_back({"keel-worker", std::move(main_frames), /*main=*/true});
  if (with_helper) t.threads.push_back({"keel-progress", helper(), /*main=*/false});
  return t;
}

TEST(StackGroups, NormaliseFrameDropsTheOffsetOnly) {
  EXPECT_EQ(normalise_frame("f(int)+0x1a (keel-worker)"), "f(int) (keel-worker)");
  EXPECT_EQ(normalise_frame("operator+(a, b)+0xff (lib.so)"), "operator+(a, b) (lib.so)");
  // No symbol: the module offset is all that identifies it.
  EXPECT_EQ(normalise_frame("?? (libfoo.so+0x1a2b)"), "?? (libfoo.so+0x1a2b)");
  EXPECT_EQ(normalise_frame("f+0xzz (m)"), "f+0xzz (m)");
  EXPECT_EQ(normalise_frame("f+0x (m)"), "f+0x (m)");
  EXPECT_EQ(normalise_frame("no module"), "no module");
}

TEST(StackGroups, SignatureStartsAtKeelCodeAndStopsBeforeMain) {
  EXPECT_EQ(stack_signature(all_reduce(true)),
            (Frames{"keel::SocketCommunicator::all_reduce(float*, unsigned long) (keel-worker)",
                    "keel::GradSync::finish() (keel-worker)", "keel::StepLoop::run() (keel-worker)",
                    "keel::Worker::run() (keel-worker)"}));
  EXPECT_EQ(stack_signature(all_reduce(true)), stack_signature(all_reduce(false, 0x44)));
  // No keel frame: the library frames, still cut at main.
  EXPECT_EQ(
      stack_signature({"__poll+0x4f (libc.so.6)", "main+0x1 (python3)", "_start+0x2 (python3)"}),
      (Frames{"__poll (libc.so.6)"}));
  // Only main() and beyond: nothing to cut to, so all of it.
  EXPECT_EQ(stack_signature({"main+0x1 (keel-worker)", "_start+0x2 (keel-worker)"}),
            (Frames{"main (keel-worker)", "_start (keel-worker)"}));
  EXPECT_EQ(stack_signature({}), Frames{});
}

TEST(StackGroups, ARankOutsideEveryWaitIsTheCulprit) {
  std::vector<RankThreads> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back(rank(r, r == 5 ? spinning(0x13) : all_reduce(r % 2)));
  const StackVerdict v = group_stacks(ranks);
  EXPECT_EQ(v.culprits, std::vector<int>{5});
  EXPECT_EQ(v.healthy, (std::vector<int>{0, 1, 2, 3, 4, 6, 7}));
  EXPECT_TRUE(v.unknown.empty());
  ASSERT_EQ(v.groups.size(), 2u);
  EXPECT_EQ(v.groups[0].ranks.size(), 7u);
  EXPECT_TRUE(v.groups[0].waiting);
  EXPECT_FALSE(v.groups[1].waiting);
  EXPECT_EQ(v.reason,
            "rank 5's main thread is in keel::spin_forever() <- FaultInjector::before_step() <- "
            "StepLoop::run() <- ... while 7 ranks wait in SocketCommunicator::all_reduce() <- "
            "GradSync::finish() <- StepLoop::run() <- ...");
  // The helper threads are one group on all ranks, and play no part.
  ASSERT_EQ(v.helpers.size(), 1u);
  EXPECT_EQ(v.helpers[0].name, "keel-progress");
  EXPECT_EQ(v.helpers[0].ranks.size(), 8u);
}

TEST(StackGroups, SeveralOutliersInDifferentPlacesAreAllNamed) {
  std::vector<RankThreads> ranks;
  for (int r = 0; r < 8; ++r)
    ranks.push_back(rank(r, r == 2 ? in_gemm() : r == 6 ? spinning(0x20) : all_reduce(true)));
  const StackVerdict v = group_stacks(ranks);
  EXPECT_EQ(v.culprits, (std::vector<int>{2, 6}));
  EXPECT_NE(v.reason.find("ranks 2,6's main threads are in "), std::string::npos) << v.reason;
  EXPECT_NE(v.reason.find("CpuBackend::matmul() <- "), std::string::npos);
  EXPECT_NE(v.reason.find("while 6 ranks wait in"), std::string::npos) << v.reason;
}

TEST(StackGroups, SpinningAtAnotherInstructionIsTheSameStack) {
  std::vector<RankThreads> ranks = {rank(0, spinning(0x10)), rank(1, spinning(0x2c)),
                                    rank(2, spinning(0x31)), rank(3, all_reduce(true))};
  const StackVerdict v = group_stacks(ranks);
  ASSERT_EQ(v.groups.size(), 2u);
  EXPECT_EQ(v.groups[0].ranks, (std::vector<int>{0, 1, 2}));
  // Three ranks not waiting and one waiting: the waiting one is not "the few", but the
  // spinning three are the majority, so the odd one out is the waiting rank.
  EXPECT_EQ(v.culprits, std::vector<int>{3});
  EXPECT_NE(v.reason.find("while 3 ranks are in keel::spin_forever() <- "), std::string::npos)
      << v.reason;
}

TEST(StackGroups, TwoRanksOneWaitingOnTheOther) {
  const StackVerdict v = group_stacks({rank(0, all_reduce(true)), rank(1, in_gemm())});
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.healthy, std::vector<int>{0});
  EXPECT_NE(v.reason.find("while 1 rank waits in "), std::string::npos) << v.reason;
}

TEST(StackGroups, AMajorityOfWaitersNamesTheOddWaiter) {
  // Every rank waits, one of them somewhere else (a collective its peers never entered).
  Frames stuck = with_start({"nanosleep+0x13 (libc.so.6)",
                             "keel::FaultyCommunicator::maybe_hang() const+0x40 (keel-worker)",
                             "keel::FaultyCommunicator::all_reduce(float*, unsigned long)+0x9 "
                             "(keel-worker)"});
  std::vector<RankThreads> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(rank(r, r == 3 ? stuck : all_reduce(r % 2)));
  const StackVerdict v = group_stacks(ranks);
  EXPECT_EQ(v.culprits, std::vector<int>{3});
  EXPECT_EQ(v.healthy, (std::vector<int>{0, 1, 2}));
  EXPECT_NE(v.reason.find("rank 3's main thread is in FaultyCommunicator::maybe_hang() <- "),
            std::string::npos)
      << v.reason;
  EXPECT_NE(v.reason.find("while 3 ranks wait in SocketCommunicator::all_reduce() <- "),
            std::string::npos)
      << v.reason;
}

TEST(StackGroups, WaitingForTheGradSyncThreadIsWaiting) {
  // The main thread waits on a condition variable for the all-reduce its GradSync thread
  // runs: as much a wait on the other ranks as being inside the collective.
  Frames grad_sync = with_start({"pthread_cond_wait+0x1e8 (libc.so.6)",
                                 "keel::GradSync::finish()+0x12 (keel-worker)",
                                 "keel::Trainer::step()+0x2a0 (keel-worker)"});
  std::vector<RankThreads> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.push_back(rank(r, r == 2 ? spinning(0x1) : r < 2 ? grad_sync : all_reduce(true)));
  const StackVerdict v = group_stacks(ranks);
  EXPECT_EQ(v.culprits, std::vector<int>{2});
  EXPECT_NE(
      v.reason.find(
          "while 3 ranks wait in GradSync::finish() <- Trainer::step() <- StepLoop::run() <- ... "
          "(2), SocketCommunicator::all_reduce() <- GradSync::finish() <- "
          "StepLoop::run() <- ... (1)"),
      std::string::npos)
      << v.reason;
}

TEST(StackGroups, ShortFunctionKeepsTheNameOnly) {
  EXPECT_EQ(short_function("keel::(anonymous namespace)::spin_forever()"), "keel::spin_forever()");
  EXPECT_EQ(short_function("keel::(anonymous namespace)::SocketCommunicator::all_reduce(float*, "
                           "unsigned long, keel::ReduceOp, std::chrono::duration<long, "
                           "std::ratio<1l, 1000l> >)"),
            "SocketCommunicator::all_reduce()");
  EXPECT_EQ(short_function("void keel::(anonymous namespace)::SocketCommunicator::call<keel::("
                           "anonymous namespace)::SocketCommunicator::send_recv(void const*)::"
                           "{lambda()#1}>(char const*, int)"),
            "SocketCommunicator::call()");
  EXPECT_EQ(short_function("keel::FaultyCommunicator::all_reduce(float*, unsigned long) [clone "
                           ".localalias]"),
            "FaultyCommunicator::all_reduce()");
  EXPECT_EQ(short_function("keel::FaultyCommunicator::maybe_hang() const"),
            "FaultyCommunicator::maybe_hang()");
  EXPECT_EQ(short_function("keel::RecoveryClient::watch(int, std::function<void ()>)::{lambda()"
                           "#1}::operator()() const"),
            "watch::operator()");
  EXPECT_EQ(short_function("std::vector<int, std::allocator<int> >::operator[](unsigned long)"),
            "vector::operator[]");
  EXPECT_EQ(short_function("main"), "main()");
  EXPECT_EQ(short_function("?? (lib.so+0x12)"), "?? (lib.so+0x12)");
}

TEST(StackGroups, AllInOnePlaceHasNoOutlier) {
  std::vector<RankThreads> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(rank(r, all_reduce(r % 2)));
  const StackVerdict v = group_stacks(ranks);
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.healthy, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_NE(v.reason.find("all 4 ranks' main threads are in "), std::string::npos) << v.reason;
  EXPECT_NE(v.reason.find("no outlier"), std::string::npos);
}

TEST(StackGroups, EveryRankElsewhereHasNoCulprit) {
  Frames other = with_start({"keel::Trainer::step()+0x10 (keel-worker)"});
  const StackVerdict v =
      group_stacks({rank(0, spinning(0x10)), rank(1, in_gemm()), rank(2, other)});
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_TRUE(v.healthy.empty());
  EXPECT_EQ(v.groups.size(), 3u);
  EXPECT_EQ(v.reason,
            "every rank's main thread is somewhere else (3 different stacks): no outlier");
}

TEST(StackGroups, ATieHasNoCulprit) {
  Frames recv = with_start({"recv+0x2a (libc.so.6)",
                            "keel::SocketCommunicator::recv(float*, unsigned long, int)+0x10 "
                            "(keel-worker)"});
  const StackVerdict v = group_stacks(
      {rank(0, all_reduce(true)), rank(1, all_reduce(false)), rank(2, recv), rank(3, recv)});
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.reason,
            "no main-thread stack is shared by more than half of the 4 ranks (groups of 2, 2): "
            "no outlier");
}

TEST(StackGroups, AsManyBusyAsWaitingIsNotEnough) {
  // Two ranks outside any wait, two inside: the busy ones are not a minority, and no stack
  // has a majority.
  const StackVerdict v = group_stacks({rank(0, all_reduce(true)), rank(1, all_reduce(true)),
                                       rank(2, in_gemm()), rank(3, spinning(0x1))});
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.reason,
            "no main-thread stack is shared by more than half of the 4 ranks (groups of 2, 1, "
            "1): no outlier");
}

TEST(StackGroups, RanksWithoutAStackAreNamedButNeverCulprits) {
  RankThreads failed;
  failed.rank = 3;
  failed.error = "cannot trace pid 42: Operation not permitted";
  RankThreads helpers_only = rank(4, {}, /*with_helper=*/true);  // main thread: no frames
  std::vector<RankThreads> ranks = {rank(0, all_reduce(true)), rank(1, all_reduce(true)),
                                    rank(2, in_gemm()), failed, helpers_only};
  const StackVerdict v = group_stacks(ranks);
  EXPECT_EQ(v.unknown, (std::vector<int>{3, 4}));
  EXPECT_EQ(v.culprits, std::vector<int>{2});
  EXPECT_NE(v.reason.find("; no stack from ranks 3-4"), std::string::npos) << v.reason;
}

TEST(StackGroups, FewerThanTwoStacksCannotBeCompared) {
  RankThreads failed;
  failed.rank = 1;
  failed.error = "no such process";
  const StackVerdict v = group_stacks({rank(0, spinning(0x1)), failed});
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.reason,
            "fewer than 2 ranks' main-thread stacks: nothing to compare; no stack from rank 1");
  EXPECT_TRUE(group_stacks({}).culprits.empty());
}

TEST(StackGroups, OptionsChooseWhatWaitsAndWhatIsOwnCode) {
  // With no wait markers, rule 1 never applies: 1 rank spinning and 1 waiting is a tie.
  StackGroupOptions o;
  o.wait_markers.clear();
  EXPECT_TRUE(group_stacks({rank(0, all_reduce(true)), rank(1, in_gemm())}, o).culprits.empty());
  // A plugin of another name counts as own code when told so.
  o = StackGroupOptions{};
  o.own_modules.push_back("libmymodel.so");
  EXPECT_EQ(stack_signature({"f+0x1 (libmymodel.so)", "main+0x1 (keel-worker)"}, o),
            Frames{"f (libmymodel.so)"});
}

TEST(StackGroups, FormatShowsVerdictGroupsAndHelpers) {
  std::vector<RankThreads> ranks;
  for (int r = 0; r < 3; ++r) ranks.push_back(rank(r, r == 1 ? spinning(0x13) : all_reduce(true)));
  const std::string text = format_verdict(group_stacks(ranks));
  EXPECT_NE(text.find("verdict: rank 1's main thread is in "), std::string::npos) << text;
  EXPECT_NE(text.find("culprits: 1\nhealthy: 0,2\nno stack: -\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  2 rank(s) 0,2 (waiting):\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  3 rank(s) 0-2, thread \"keel-progress\":\n"), std::string::npos) << text;
  EXPECT_NE(text.find("      keel::ProgressReporter::loop() (keel-worker)\n"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace keel
