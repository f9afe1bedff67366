// The stop-time diagnostics' verdict (robust/diagnostics.h), without processes.
#include "robust/diagnostics.h"

#include <gtest/gtest.h>

#include <initializer_list>

namespace keel::diag {
namespace {

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

report::Diagnostic row(int rank, int slot) {
  report::Diagnostic d;
  d.set_rank(rank);
  d.set_slot(slot);
  d.set_answered(true);
  d.set_gemm_ok(true);
  d.set_golden_ok(true);
  return d;
}

// A group test as member `d` saw it.
void group(report::Diagnostic* d, const std::string& name, bool ok, double bytes_per_s,
           int blamed = -1) {
  report::DiagnosticGroup* g = d->add_groups();
  g->set_group(name);
  g->set_ok(ok);
  g->set_bytes_per_s(bytes_per_s);
  g->set_blamed_rank(blamed);
}

// TP2 groups {0,1} on slot 0 and {2,3} on slot 1, DP2 groups {0,2} and {1,3}.
std::vector<report::Diagnostic> healthy_2x2() {
  std::vector<report::Diagnostic> rows;
  for (int r = 0; r < 4; ++r) {
    rows.push_back(row(r, r / 2));
    group(&rows.back(), r < 2 ? "tp.dp0.pp0" : "tp.dp1.pp0", true, 1e9);
    group(&rows.back(), r % 2 ? "dp.pp0.tp1" : "dp.pp0.tp0", true, 1e9);
  }
  return rows;
}

TEST(Diagnostics, AllPassingFailsNobody) {
  const Verdict v = judge(healthy_2x2(), {0, 1});
  EXPECT_TRUE(v.failed_slots.empty());
  EXPECT_TRUE(has(v.summary, "suspect slots 0, 1 passed")) << v.summary;
  EXPECT_TRUE(has(v.summary, "(4 processes)")) << v.summary;
}

TEST(Diagnostics, SilenceGemmAndGoldenFailTheirSlot) {
  std::vector<report::Diagnostic> rows = healthy_2x2();
  rows[3].set_golden_ok(false);
  Verdict v = judge(rows, {0, 1});
  EXPECT_EQ(v.failed_slots, std::vector<int>{1});
  EXPECT_TRUE(has(v.summary, "slot 1 fails (rank 3: golden mini-GPT differs)")) << v.summary;
  EXPECT_TRUE(has(v.summary, "slot 0 passed")) << v.summary;

  rows = healthy_2x2();
  rows[0].set_gemm_ok(false);
  rows[0].set_gemm_max_rel_error(0.25);
  EXPECT_EQ(judge(rows, {0, 1}).failed_slots, std::vector<int>{0});

  rows = healthy_2x2();
  rows[2] = row(2, 1);
  rows[2].set_answered(false);
  v = judge(rows, {0, 1});
  EXPECT_EQ(v.failed_slots, std::vector<int>{1});
  EXPECT_TRUE(has(v.summary, "rank 2 did not answer")) << v.summary;

  rows = healthy_2x2();
  rows[1].set_error("no CUDA device");
  v = judge(rows, {0, 1});
  EXPECT_EQ(v.failed_slots, std::vector<int>{0});
  EXPECT_TRUE(has(v.summary, "rank 1: no CUDA device")) << v.summary;
}

TEST(Diagnostics, OnlySuspectSlotsFail) {
  std::vector<report::Diagnostic> rows = healthy_2x2();
  rows[0].set_golden_ok(false);  // slot 0 is only a peer here
  const Verdict v = judge(rows, {1});
  EXPECT_TRUE(v.failed_slots.empty());
  EXPECT_TRUE(has(v.summary, "slot 1 passed")) << v.summary;
  EXPECT_TRUE(has(v.summary, "not suspect: slot 0 rank 0: golden mini-GPT differs")) << v.summary;
  // Slot 0 can fail when it is a suspect (the policy decides what to do with it).
  EXPECT_EQ(judge(rows, {0, 1}).failed_slots, std::vector<int>{0});
  // A suspect without any process is said, not failed.
  const std::string s = judge(healthy_2x2(), {0, 1, 7}).summary;
  EXPECT_TRUE(has(s, "slot 7 not checked (no process)")) << s;
}

TEST(Diagnostics, AMemberThatBrokeItsLinksNamesItselfAndFails) {
  // Rank 3's links broke: it names itself, its TP and DP peers name it.
  std::vector<report::Diagnostic> rows;
  for (int r = 0; r < 4; ++r) rows.push_back(row(r, r / 2));
  group(&rows[0], "tp.dp0.pp0", true, 1e9);
  group(&rows[1], "tp.dp0.pp0", true, 1e9);
  group(&rows[2], "tp.dp1.pp0", false, 0, 3);
  group(&rows[3], "tp.dp1.pp0", false, 0, 3);
  group(&rows[0], "dp.pp0.tp0", true, 1e9);
  group(&rows[2], "dp.pp0.tp0", true, 1e9);
  group(&rows[1], "dp.pp0.tp1", false, 0, 3);
  group(&rows[3], "dp.pp0.tp1", false, 0, 3);
  Verdict v = judge(rows, {0, 1});
  EXPECT_EQ(v.failed_slots, std::vector<int>{1});
  EXPECT_EQ(v.reasons[1], (std::vector<std::string>{"rank 3 broke its links in dp.pp0.tp1",
                                                    "rank 3 broke its links in tp.dp1.pp0"}));
  EXPECT_TRUE(has(v.summary, "slot 0 passed")) << v.summary;

  // Blamed on a slot that is not suspect: noted, nobody fails.
  v = judge(rows, {0});
  EXPECT_TRUE(v.failed_slots.empty());
  EXPECT_TRUE(has(v.summary, "not suspect: slot 1 rank 3 broke its links")) << v.summary;

  // Without a confession (rank 3 only timed out) one name of two failing members is no
  // majority: nobody fails, the groups are said to have failed without a culprit.
  rows[3].mutable_groups(0)->set_blamed_rank(-1);
  rows[3].mutable_groups(1)->set_blamed_rank(-1);
  v = judge(rows, {0, 1});
  EXPECT_TRUE(v.failed_slots.empty()) << v.summary;
  EXPECT_TRUE(has(v.summary, "tp.dp1.pp0 failed for 2 members without a culprit")) << v.summary;
}

TEST(Diagnostics, ABreakPassedAlongARingStillFailsTheMemberThatBrokeIt) {
  // Rank 2 of a DP4 group broke its links; rank 3 saw it, ranks 0 and 1 saw their neighbours
  // go: no majority, but rank 2 names itself.
  std::vector<report::Diagnostic> rows;
  for (int r = 0; r < 4; ++r) rows.push_back(row(r, r));
  const int named[4] = {3, 0, 2, 2};
  for (int r = 0; r < 4; ++r) group(&rows[size_t(r)], "dp.pp0.tp0", false, 0, named[r]);
  const Verdict v = judge(rows, {0, 1, 2, 3});
  EXPECT_EQ(v.failed_slots, std::vector<int>{2}) << v.summary;
}

TEST(Diagnostics, TheRankMostFailingMembersNameFailsAndHalfIsNoMajority) {
  // Four members; two time out (no name), one names rank 1, one names rank 2.
  std::vector<report::Diagnostic> rows;
  for (int r = 0; r < 4; ++r) rows.push_back(row(r, r));
  group(&rows[0], "pp.dp0.tp0", false, 0, -1);
  group(&rows[1], "pp.dp0.tp0", false, 0, 2);
  group(&rows[2], "pp.dp0.tp0", false, 0, 1);
  group(&rows[3], "pp.dp0.tp0", false, 0, -1);
  Verdict v = judge(rows, {0, 1, 2, 3});
  EXPECT_TRUE(v.failed_slots.empty());
  EXPECT_TRUE(has(v.summary, "pp.dp0.tp0 failed for 4 members without a culprit")) << v.summary;
  // Three of four name rank 2: a majority.
  rows[0].mutable_groups(0)->set_blamed_rank(2);
  rows[3].mutable_groups(0)->set_blamed_rank(2);
  v = judge(rows, {0, 1, 2, 3});
  EXPECT_EQ(v.failed_slots, std::vector<int>{2});
  // Half is no majority.
  rows[0].mutable_groups(0)->set_blamed_rank(-1);
  EXPECT_TRUE(judge(rows, {0, 1, 2, 3}).failed_slots.empty());
}

TEST(Diagnostics, ASlowLinkIsBelowTheMedianBySlowFactor) {
  std::vector<report::Diagnostic> rows;
  const double rate[4] = {1.0e9, 0.9e9, 1.1e9, 0.6e9};  // median 0.95e9
  for (int r = 0; r < 4; ++r) {
    rows.push_back(row(r, 10 + r));
    group(&rows.back(), "dp.pp0.tp0", true, rate[r]);
  }
  Verdict v = judge(rows, {10, 11, 12, 13});
  EXPECT_EQ(v.failed_slots, std::vector<int>{13});  // 0.6 < 0.95 / 1.5
  EXPECT_TRUE(has(v.summary, "rank 3: slow link in dp.pp0.tp0 (600.0 MB/s, median 950.0 MB/s)"))
      << v.summary;
  // At 2x only a member under half the median is slow.
  EXPECT_TRUE(judge(rows, {10, 11, 12, 13}, 2.0).failed_slots.empty());
  // Two members cannot tell a slow link from a slow peer.
  rows.resize(2);
  rows[1].mutable_groups(0)->set_bytes_per_s(0.1e9);
  EXPECT_TRUE(judge(rows, {10, 11}).failed_slots.empty());
}

}  // namespace
}  // namespace keel::diag
