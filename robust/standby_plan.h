// Standby sizing (keel-ctl plan-standby): how many warm spares cover the machines that are
// down at the same moment, at a given percentile, under a binomial model. Each of N machines
// fails independently with mean time between failures H hours and is then out for R minutes
// (repaired or replaced; a spare stands in meanwhile), so at any instant it is down with the
// steady-state unavailability p = (R/60) / (H + R/60), and the number down at once is
// X ~ Binomial(N, p). The plan is the smallest k with P(X <= k) >= percentile/100.
#pragma once

#include <string>
#include <vector>

namespace keel {

struct StandbyPlan {
  // The inputs, as given.
  int machines = 0;
  double mtbf_hours = 0;
  double recovery_minutes = 0;
  double percentile = 0;
  // p: the probability that one machine is down at a given instant.
  double unavailability = 0;
  // N·p: the mean number of machines down at once.
  double expected_down = 0;
  // k: the number of spares.
  int spares = 0;
  // P(X <= k), P(X <= k-1) (0 when k = 0) and P(X > k), the last summed over the upper
  // tail itself so that it stays accurate where 1 - P(X <= k) would round to 0.
  double cdf_at_spares = 0;
  double cdf_below_spares = 0;
  double tail_above_spares = 0;
  // P(X <= j) for j = k-1 .. k+2, clipped to 0 .. N.
  struct Row {
    int down = 0;
    double cdf = 0;
  };
  std::vector<Row> table;
};

// The bound on machines: the CDF costs O(N) time and memory, and no job comes near it.
inline constexpr int kMaxStandbyMachines = 1'000'000;

// The plan for `machines` machines. Throws keel::InputError naming the keel-ctl flag and the
// value when machines < 1 or > kMaxStandbyMachines, mtbf_hours <= 0 or not finite,
// recovery_minutes < 0 or not finite, or percentile outside (0, 100). Runs in O(machines).
StandbyPlan plan_standby(int machines, double mtbf_hours, double recovery_minutes,
                         double percentile);

// The plan as keel-ctl prints it: the inputs, p, N·p, k with P(X <= k) and P(X <= k-1), and
// one line of the cumulative table around k. Ends with a newline.
std::string format_standby_plan(const StandbyPlan& plan);

}  // namespace keel
