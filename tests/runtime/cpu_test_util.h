// Helpers shared by the CPU backend tests: random data and tolerance checks against
// double-precision references.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace keel::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Every |got − want| <= atol + rtol·|want|; reports the worst element.
inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<double>& want, double atol,
                                            double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != expected " << want.size();
  }
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::abs(double(got[i]) - want[i]);
    double excess = err - (atol + rtol * std::abs(want[i]));
    if (!(excess <= 0) && (std::isnan(excess) || excess > worst_excess)) {
      worst = i;
      worst_excess = std::isnan(excess) ? INFINITY : excess;
    }
  }
  if (worst_excess < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << worst << ": got " << got[worst] << ", expected " << want[worst]
         << " (atol " << atol << ", rtol " << rtol << ")";
}

// Central finite differences in double of Σ f(x)·w with respect to x.
template <typename F>
std::vector<double> numeric_grad(F&& f, std::vector<double> x, const std::vector<double>& w,
                                 double h = 1e-5) {
  std::vector<double> grad(x.size());
  auto objective = [&] {
    std::vector<double> y = f(x);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = objective();
    x[i] = saved - h;
    const double minus = objective();
    x[i] = saved;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

}  // namespace keel::test
