#include "robust/standby_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "runtime/check.h"

namespace keel {

namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

[[noreturn]] void reject(const char* flag, double value, const char* want) {
  throw InputError(std::string("plan-standby: ") + flag + " " + number(value) + ": " + want);
}

}  // namespace

StandbyPlan plan_standby(int machines, double mtbf_hours, double recovery_minutes,
                         double percentile) {
  if (machines < 1 || machines > kMaxStandbyMachines)
    reject("--machines", machines,
           ("must be between 1 and " + std::to_string(kMaxStandbyMachines)).c_str());
  // Written as !(x > 0) so that NaN is refused too.
  if (!(mtbf_hours > 0) || !std::isfinite(mtbf_hours))
    reject("--mtbf-hours", mtbf_hours, "must be a finite number of hours > 0");
  if (!(recovery_minutes >= 0) || !std::isfinite(recovery_minutes))
    reject("--recovery-minutes", recovery_minutes, "must be a finite number of minutes >= 0");
  if (!(percentile > 0 && percentile < 100))
    reject("--percentile", percentile, "must be strictly between 0 and 100");

  StandbyPlan plan;
  plan.machines = machines;
  plan.mtbf_hours = mtbf_hours;
  plan.recovery_minutes = recovery_minutes;
  plan.percentile = percentile;
  const long double n = machines;
  const long double r = recovery_minutes / 60.0L;
  const long double p = r / (static_cast<long double>(mtbf_hours) + r);
  plan.unavailability = static_cast<double>(p);
  plan.expected_down = static_cast<double>(n * p);

  // pmf(j) in log space, scaled by the pmf at the mode so that the terms that matter are
  // near 1: for N = 100,000 and p = 0.5, pmf(0) = 2^-100000 is below even long double's
  // range, and a plain product or a sum from j = 0 would lose everything. Terms far from
  // the mode underflow to 0, which is their value to the precision kept. p = 0 (R = 0) and
  // a p that rounds to 1 put all the mass on one point; log(0) would give NaN there.
  std::vector<long double> w(machines + 1, 0.0L);
  if (p <= 0) {
    w[0] = 1;
  } else if (p >= 1) {
    w[machines] = 1;
  } else {
    const long double lp = std::log(p), lq = std::log1p(-p), lgn = std::lgamma(n + 1);
    auto log_pmf = [&](int j) {
      return lgn - std::lgamma(j + 1.0L) - std::lgamma(n - j + 1) + j * lp + (n - j) * lq;
    };
    const int mode = std::clamp(static_cast<int>(std::floor((n + 1) * p)), 0, machines);
    const long double top = log_pmf(mode);
    for (int j = 0; j <= machines; ++j) w[j] = std::exp(log_pmf(j) - top);
  }
  // Normalised by the computed total rather than by exp(top), so that the rounding of
  // lgamma cancels and the terms sum to 1 by construction.
  std::vector<long double> prefix(machines + 1);
  long double acc = 0;
  for (int j = 0; j <= machines; ++j) prefix[j] = acc += w[j];
  const long double total = acc;
  auto cdf = [&](int j) -> long double {
    if (j < 0) return 0;
    if (j >= machines) return 1;
    return prefix[j] / total;
  };

  const long double target = percentile / 100.0L;
  int k = 0;
  while (k < machines && cdf(k) < target) ++k;
  plan.spares = k;
  plan.cdf_at_spares = static_cast<double>(cdf(k));
  plan.cdf_below_spares = static_cast<double>(cdf(k - 1));
  // The upper tail summed from N down, smallest terms first.
  long double tail = 0;
  for (int j = machines; j > k; --j) tail += w[j];
  plan.tail_above_spares = static_cast<double>(tail / total);
  for (int j = std::max(0, k - 1); j <= std::min(machines, k + 2); ++j)
    plan.table.push_back({j, static_cast<double>(cdf(j))});
  return plan;
}

std::string format_standby_plan(const StandbyPlan& s) {
  char buf[512];
  std::string out;
  auto line = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof buf, fmt, args...);
    out += buf;
  };
  out +=
      "standby plan (binomial model: machines fail independently; a spare stands in for a\n"
      "failed machine until it is repaired or replaced)\n";
  line("  machines             N = %d\n", s.machines);
  line("  MTBF per machine     H = %g h\n", s.mtbf_hours);
  line("  recovery per failure R = %g min\n", s.recovery_minutes);
  line(
      "  unavailability       p = (R/60) / (H + R/60) = %.6g\n"
      "                           (the steady-state unavailability of one machine)\n",
      s.unavailability);
  line("  expected down      N*p = %.6g\n", s.expected_down);
  line("  percentile             = %g\n", s.percentile);
  line("spares k = %d: the smallest k with P(X <= k) >= %g, X ~ Binomial(%d, %.6g)\n", s.spares,
       s.percentile / 100, s.machines, s.unavailability);
  line("  P(X <= %d) = %.9f\n", s.spares, s.cdf_at_spares);
  line("  P(X <= %d) = %.9f\n", s.spares - 1, s.cdf_below_spares);
  line("  P(X >  %d) = %.3g  (more machines down at once than spares)\n", s.spares,
       s.tail_above_spares);
  out += "  P(X <= j):";
  for (const StandbyPlan::Row& row : s.table) {
    line("  j=%d %.6f", row.down, row.cdf);
    if (row.down == s.spares) out += " <- k";
  }
  out += "\n";
  return out;
}

}  // namespace keel
