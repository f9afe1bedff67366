// Fail-slow rules (robust/slow_rules.h) on synthetic rounds of a TP2×PP2×DP2 job (8 ranks;
// stage 0 = ranks 0-3... by Topology), with a fixed-seed noise model.
#include "robust/slow_rules.h"

#include <gtest/gtest.h>

#include <random>

namespace keel {
namespace {

constexpr int kSteps = 10;

config::DetectConfig detect() {
  config::DetectConfig dc;  // defaults: factor 1.5, 3 of 5 rounds
  return dc;
}

struct Job {
  Topology topo{2, 2, 2};
  std::mt19937 rng{7};
  double noise = 0.15;                            // ± uniform share of each figure
  std::map<int, double> compute_factor, link_ms;  // per rank: slower compute, slower sends
  double step_factor = 1.0;

  double jitter() { return 1 + std::uniform_real_distribution<double>(-noise, noise)(rng); }

  std::map<int, control::RoundStats> round(int64_t k) {
    std::map<int, control::RoundStats> out;
    double worst = 1;
    for (const auto& [r, f] : compute_factor) worst = std::max(worst, f);
    for (int r = 0; r < topo.world_size(); ++r) {
      control::RoundStats s;
      s.set_round(k);
      s.set_steps(kSteps);
      const double f = compute_factor.count(r) ? compute_factor[r] : 1.0;
      s.set_compute_s(kSteps * 0.010 * f * jitter());
      s.set_wall_s(kSteps * 0.012 * worst * step_factor * jitter());
      for (const auto& [group, peers] : std::map<std::string, std::vector<int>>{
               {"tp", topo.tp_group(r)}, {"pp", topo.pp_group(r)}}) {
        for (int q : peers) {
          if (q == r) continue;
          control::LinkRound* l = s.add_links();
          l->set_group(group);
          l->set_peer(q);
          l->set_sends(kSteps * 8);
          const double extra = link_ms.count(r) ? link_ms[r] / 1000 : 0;
          l->set_send_seconds(l->sends() * (0.00005 * jitter() + extra));
          l->set_bytes(l->sends() * 65536.0);
        }
      }
      out[r] = s;
    }
    return out;
  }
};

// The first round with a verdict other than none, from round 1 on; -1 if none in `rounds`.
int64_t first_verdict(SlowDetector& d, Job& job, int64_t rounds, SlowVerdict* v) {
  for (int64_t k = 1; k <= rounds; ++k) {
    *v = d.observe(job.topo, job.round(k));
    if (v->kind != SlowVerdict::Kind::kNone) return k;
  }
  return -1;
}

TEST(SlowRules, NoisyButHealthyFlagsNobodyInAThousandRounds) {
  SlowDetector d(detect());
  Job job;
  job.noise = 0.30;
  SlowVerdict v;
  EXPECT_EQ(first_verdict(d, job, 1000, &v), -1) << v.detail;
}

TEST(SlowRules, AFourTimesSlowerRankIsTheDegraderAfterThreeRounds) {
  SlowDetector d(detect());
  Job job;
  job.compute_factor[5] = 4.0;
  SlowVerdict v;
  // Round 1 warms up; rounds 2, 3, 4 are the three of evidence.
  EXPECT_EQ(first_verdict(d, job, 20, &v), 4);
  EXPECT_EQ(v.kind, SlowVerdict::Kind::kSlowRank);
  EXPECT_EQ(v.rank, 5);
  EXPECT_NEAR(v.factor, 4.0, 1.0);
  EXPECT_NE(v.detail.find("rank 5"), std::string::npos) << v.detail;
  EXPECT_NE(v.figures.find("r5"), std::string::npos) << v.figures;
  EXPECT_EQ(v.slowest, 5);
}

TEST(SlowRules, OneAndAHalfTimesIsFoundWhenTheNoiseAllows) {
  SlowDetector d(detect());
  Job job;
  job.noise = 0.03;
  job.compute_factor[2] = 1.6;
  SlowVerdict v;
  EXPECT_GT(first_verdict(d, job, 20, &v), 0);
  EXPECT_EQ(v.rank, 2);
}

TEST(SlowRules, ASlowLinkIsPinnedOnItsSenderNotOnItsPeers) {
  SlowDetector d(detect());
  Job job;
  job.link_ms[3] = 2.0;  // 80 messages a step × 2 ms: far above 5% of a 12 ms step
  SlowVerdict v;
  EXPECT_GT(first_verdict(d, job, 20, &v), 0);
  EXPECT_EQ(v.kind, SlowVerdict::Kind::kSlowLink);
  EXPECT_EQ(v.rank, 3);
}

TEST(SlowRules, LinksIntoASlowComputerAreItsNotTheirs) {
  SlowDetector d(detect());
  Job job;
  job.compute_factor[6] = 4.0;
  // Its peers' sends wait for it to read: make every link into rank 6 slow.
  SlowVerdict v;
  for (int64_t k = 1; k <= 20 && v.kind == SlowVerdict::Kind::kNone; ++k) {
    auto round = job.round(k);
    for (auto& [r, s] : round)
      for (auto& l : *s.mutable_links())
        if (l.peer() == 6) l.set_send_seconds(l.sends() * 0.003);
    v = d.observe(job.topo, round);
  }
  EXPECT_EQ(v.kind, SlowVerdict::Kind::kSlowRank);
  EXPECT_EQ(v.rank, 6);
}

// Where ranks mostly wait for each other, compute is a small share of a step: a rank that
// computes twice its peers' but costs the step under 10% is no degrader (measured here: 1.1
// against 0.55 ms in a 9 ms step, every round, from where the rank runs).
TEST(SlowRules, ARankWhoseExcessCostsTheStepLittleIsNoDegrader) {
  SlowDetector d(detect());
  Job job;
  job.compute_factor[3] = 2.0;
  SlowVerdict v;
  for (int64_t k = 1; k <= 50 && v.kind == SlowVerdict::Kind::kNone; ++k) {
    auto round = job.round(k);
    for (auto& [r, s] : round) s.set_wall_s(kSteps * 0.150);  // compute is 7% of a step
    v = d.observe(job.topo, round);
  }
  EXPECT_EQ(v.kind, SlowVerdict::Kind::kNone) << v.detail;
}

TEST(SlowRules, ATinyExcessOnALinkDoesNotCount) {
  SlowDetector d(detect());
  Job job;
  job.link_ms[3] = 0.001;  // 20x the per-message median, but 0.08 ms a step
  SlowVerdict v;
  EXPECT_EQ(first_verdict(d, job, 50, &v), -1) << v.detail;
}

TEST(SlowRules, AJobThatSlowsAsAWholeIsADeclineOnce) {
  SlowDetector d(detect());
  Job job;
  job.noise = 0.05;
  SlowVerdict v;
  for (int64_t k = 1; k <= 10; ++k)
    ASSERT_EQ(d.observe(job.topo, job.round(k)).kind, SlowVerdict::Kind::kNone);
  job.step_factor = 2.5;
  int declines = 0;
  for (int64_t k = 11; k <= 40; ++k) {
    v = d.observe(job.topo, job.round(k));
    if (v.kind == SlowVerdict::Kind::kMfuDecline) {
      ++declines;
      EXPECT_NEAR(v.factor, 2.5, 0.3);
    } else {
      EXPECT_EQ(v.kind, SlowVerdict::Kind::kNone) << v.detail;
    }
  }
  EXPECT_EQ(declines, 1);
}

// A machine whose speed drifts (another tenant ramping up) moves the baseline with it.
TEST(SlowRules, ASlowDriftIsNoDecline) {
  SlowDetector d(detect());
  Job job;
  job.noise = 0.05;
  for (int64_t k = 1; k <= 80; ++k) {
    job.step_factor = 1.0 + 0.02 * double(k);  // 2.6x by the end, 2% a round
    const SlowVerdict v = d.observe(job.topo, job.round(k));
    EXPECT_EQ(v.kind, SlowVerdict::Kind::kNone) << "round " << k << ": " << v.detail;
  }
}

TEST(SlowRules, ForgettingARankNamesItAgainOnlyAfterNewEvidence) {
  SlowDetector d(detect());
  Job job;
  job.compute_factor[5] = 3.0;
  SlowVerdict v;
  ASSERT_EQ(first_verdict(d, job, 20, &v), 4);
  d.forget(5);
  EXPECT_EQ(d.observe(job.topo, job.round(5)).kind, SlowVerdict::Kind::kNone);
  EXPECT_EQ(d.observe(job.topo, job.round(6)).kind, SlowVerdict::Kind::kNone);
  EXPECT_EQ(d.observe(job.topo, job.round(7)).kind, SlowVerdict::Kind::kSlowRank);
  d.reset();  // a new epoch: the first round is not judged again
  EXPECT_EQ(d.observe(job.topo, job.round(8)).kind, SlowVerdict::Kind::kNone);
}

TEST(SlowRules, AnIncompleteRoundIsNotJudged) {
  SlowDetector d(detect());
  Job job;
  job.compute_factor[5] = 4.0;
  for (int64_t k = 1; k <= 10; ++k) {
    auto round = job.round(k);
    round.erase(0);
    EXPECT_EQ(d.observe(job.topo, round).kind, SlowVerdict::Kind::kNone);
  }
}

}  // namespace
}  // namespace keel
