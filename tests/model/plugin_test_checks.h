// Checks shared by the model plugin tests (gpt_plugin_test.cc, llama_plugin_test.cc): norms of
// flattened tensors, and gradients compared elementwise against a reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "runtime/rng.h"
#include "tests/model/gpt_test_harness.h"

namespace keel::test {

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}
inline double norm(const std::vector<float>& a) {
  return std::sqrt(dot(a, a));
}
inline float max_abs(const std::vector<float>& a) {
  float m = 0;
  for (float v : a) m = std::max(m, std::fabs(v));
  return m;
}

inline void expect_no_problems(const GptRun& run) {
  for (const auto& p : run.problems) ADD_FAILURE() << p;
}

// Every gradient of `got` within rel·max|want| of `want`, elementwise.
inline void expect_grads_near(const Tensors& want, const Tensors& got, double rel) {
  for (const auto& [name, w] : want) {
    const std::vector<float>& g = got.at(name);
    ASSERT_EQ(g.size(), w.size()) << name;
    const double tol = rel * max_abs(w) + 1e-12;
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      double d = std::fabs(double(g[i]) - w[i]);
      worst = std::max(worst, d);
      bad += d > tol;
    }
    EXPECT_EQ(bad, 0u) << name << ": worst difference " << worst << ", tolerance " << tol;
  }
}

// Checks `base`'s gradient of every parameter in `descs` against central differences of
// `loss` along the gradient's own direction (where a wrong gradient shows most) and three
// random ones. Returns how many directions were checked.
inline int check_against_finite_differences(const std::vector<keel_param_desc>& descs,
                                            const Tensors& params, const GptRun& base,
                                            const std::function<double(const Tensors&)>& loss) {
  int checked = 0;
  for (const auto& d : descs) {
    const std::string name = d.name;
    const std::vector<float>& g = base.grads.at(name);
    const double gnorm = norm(g);
    EXPECT_GT(gnorm, 0) << name;
    if (!(gnorm > 0)) continue;
    std::vector<std::vector<float>> dirs{g};
    for (int k = 0; k < 3; ++k) {
      std::vector<float> v(g.size());
      for (size_t i = 0; i < v.size(); ++i) v[i] = rng::normal(3, rng::stream("direction", k), i);
      dirs.push_back(v);
    }
    const std::vector<float>& theta = params.at(name);
    const double eps = 5e-3 * std::max(1.0, norm(theta));
    for (size_t k = 0; k < dirs.size(); ++k) {
      std::vector<float>& v = dirs[k];
      const double vn = norm(v);
      for (float& x : v) x = float(x / vn);
      Tensors plus = params, minus = params;
      for (size_t i = 0; i < v.size(); ++i) {
        plus[name][i] += float(eps * v[i]);
        minus[name][i] -= float(eps * v[i]);
      }
      const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
      const double analytic = dot(g, v);
      // The quotient's own error: ~1e-3 relative from the curvature, and fp32 round-off in
      // the two losses, ~1e-5 absolute. Observed errors stay under a third of this.
      EXPECT_NEAR(numeric, analytic, 3e-3 * std::fabs(analytic) + 3e-4 * gnorm + 1e-5)
          << name << " direction " << k << " (|grad| " << gnorm << ")";
      ++checked;
    }
  }
  return checked;
}

// A split run (tp × pp) computes the one-rank run's loss and gradients within `rel`.
inline void expect_split_matches(const GptRun& one, const GptRun& split, double rel) {
  expect_no_problems(split);
  EXPECT_NEAR(split.loss_sum, one.loss_sum, rel * std::fabs(one.loss_sum));
  expect_grads_near(one.grads, split.grads, rel);
}

}  // namespace keel::test
