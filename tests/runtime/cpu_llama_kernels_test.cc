// The CPU backend's Llama kernels (RMSNorm, SwiGLU, RoPE) against double-precision references:
// forwards directly, backwards against central finite differences of the reference, with
// gradient outputs pre-filled to check that they accumulate; and bitwise the same for every
// thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "runtime/backend.h"
#include "tests/runtime/cpu_test_util.h"

namespace keel {
namespace {

using test::all_close;
using test::numeric_grad;
using test::random_floats;
using test::to_double;

std::vector<double> plus(const std::vector<float>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

std::vector<double> rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w, int N,
                                int C, std::vector<double>* rstd = nullptr) {
  std::vector<double> out(x.size());
  if (rstd) rstd->resize(N);
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[size_t(n) * C + c] * x[size_t(n) * C + c];
    const double s = 1.0 / std::sqrt(ss / C + 1e-5);
    if (rstd) (*rstd)[n] = s;
    for (int c = 0; c < C; ++c) out[size_t(n) * C + c] = x[size_t(n) * C + c] * s * w[c];
  }
  return out;
}

std::vector<double> swiglu_ref(const std::vector<double>& gu, int N, int F) {
  std::vector<double> out(size_t(N) * F);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < F; ++j) {
      const double g = gu[size_t(n) * 2 * F + j], u = gu[size_t(n) * 2 * F + F + j];
      out[size_t(n) * F + j] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

// Rotates the q and k heads of [B,T,3,NH,HS] by ±t·theta^(-2i/HS), pairs (2i, 2i+1).
std::vector<double> rope_ref(std::vector<double> qkv, int B, int T, int NH, int HS, double theta,
                             double sign = 1.0) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < 2 * NH; ++h) {
        double* v = &qkv[((size_t(b) * T + t) * 3 * NH + h) * HS];
        for (int i = 0; i < HS / 2; ++i) {
          const double a = sign * t * std::pow(theta, -2.0 * i / HS);
          const double x0 = v[2 * i], x1 = v[2 * i + 1];
          v[2 * i] = x0 * std::cos(a) - x1 * std::sin(a);
          v[2 * i + 1] = x0 * std::sin(a) + x1 * std::cos(a);
        }
      }
  return qkv;
}

TEST(RmsNorm, ForwardAndBackwardMatchReference) {
  for (int C : {13, 64}) {
    SCOPED_TRACE(C);
    const int N = 3;
    auto be = make_cpu_backend(2);
    auto x = random_floats(size_t(N) * C, 20, 2.0f), w = random_floats(C, 21);
    std::vector<float> out(x.size(), 9.0f), rstd(N, 9.0f);
    be->rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C);
    const auto xd = to_double(x), wd = to_double(w);
    std::vector<double> want_rstd;
    EXPECT_TRUE(all_close(out, rmsnorm_ref(xd, wd, N, C, &want_rstd), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(rstd, want_rstd, 1e-6, 1e-5));

    auto dout = random_floats(x.size(), 22);
    auto dx = random_floats(x.size(), 23), dw = random_floats(C, 24);
    const auto dx0 = dx, dw0 = dw;
    be->rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    const auto doutd = to_double(dout);
    auto gx = numeric_grad([&](const auto& v) { return rmsnorm_ref(v, wd, N, C); }, xd, doutd);
    auto gw = numeric_grad([&](const auto& v) { return rmsnorm_ref(xd, v, N, C); }, wd, doutd);
    EXPECT_TRUE(all_close(dx, plus(dx0, gx), 1e-4, 1e-4));
    EXPECT_TRUE(all_close(dw, plus(dw0, gw), 1e-4, 1e-4));
  }
}

TEST(SwiGlu, ForwardAndBackwardMatchReference) {
  const int N = 5, F = 19;
  auto be = make_cpu_backend(2);
  auto gu = random_floats(size_t(N) * 2 * F, 30, 3.0f);  // wide, so the gate saturates too
  std::vector<float> out(size_t(N) * F, 9.0f);
  be->swiglu_forward(out.data(), gu.data(), N, F);
  const auto gud = to_double(gu);
  EXPECT_TRUE(all_close(out, swiglu_ref(gud, N, F), 1e-5, 1e-5));

  auto dout = random_floats(out.size(), 31);
  auto dgu = random_floats(gu.size(), 32);
  const auto dgu0 = dgu;
  be->swiglu_backward(dgu.data(), gu.data(), dout.data(), N, F);
  auto want =
      numeric_grad([&](const auto& v) { return swiglu_ref(v, N, F); }, gud, to_double(dout));
  EXPECT_TRUE(all_close(dgu, plus(dgu0, want), 1e-4, 1e-4));
}

TEST(Rope, ForwardRotatesQAndKAndBackwardIsItsTranspose) {
  const int B = 2, T = 7, NH = 3, HS = 8;
  const float theta = 10000.0f;
  auto be = make_cpu_backend(2);
  auto qkv = random_floats(size_t(B) * T * 3 * NH * HS, 40);
  const auto qkvd = to_double(qkv);
  std::vector<float> rotated = qkv;
  be->rope_forward(rotated.data(), B, T, NH, HS, theta);
  EXPECT_TRUE(all_close(rotated, rope_ref(qkvd, B, T, NH, HS, theta), 1e-5, 1e-5));
  // v is untouched, bit for bit.
  for (int bt = 0; bt < B * T; ++bt)
    for (int i = 2 * NH * HS; i < 3 * NH * HS; ++i)
      ASSERT_EQ(rotated[size_t(bt) * 3 * NH * HS + i], qkv[size_t(bt) * 3 * NH * HS + i]);

  // backward maps d(rotated) to d(unrotated): the reference's gradient, which (a rotation
  // being linear) is exactly its transpose applied to dout.
  auto dout = random_floats(qkv.size(), 41);
  std::vector<float> d = dout;
  be->rope_backward(d.data(), B, T, NH, HS, theta);
  auto want = numeric_grad([&](const auto& v) { return rope_ref(v, B, T, NH, HS, theta); }, qkvd,
                           to_double(dout));
  EXPECT_TRUE(all_close(d, want, 1e-5, 1e-5));
  // And forward then backward is the identity.
  be->rope_backward(rotated.data(), B, T, NH, HS, theta);
  EXPECT_TRUE(all_close(rotated, qkvd, 1e-5, 1e-5));
}

TEST(LlamaKernels, SameBitsForEveryThreadCount) {
  const int N = 37, C = 48, F = 40, B = 2, T = 9, NH = 2, HS = 6;
  auto x = random_floats(size_t(N) * C, 50), w = random_floats(C, 51);
  auto dout = random_floats(size_t(N) * C, 52);
  auto gu = random_floats(size_t(N) * 2 * F, 53), dh = random_floats(size_t(N) * F, 54);
  auto qkv = random_floats(size_t(B) * T * 3 * NH * HS, 55);
  auto run = [&](int threads) {
    auto be = make_cpu_backend(threads);
    std::vector<float> out(x.size()), rstd(N), dx(x.size()), dw(C), h(dh.size()), dgu(gu.size());
    std::vector<float> q = qkv;
    be->rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C);
    be->rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    be->swiglu_forward(h.data(), gu.data(), N, F);
    be->swiglu_backward(dgu.data(), gu.data(), dh.data(), N, F);
    be->rope_forward(q.data(), B, T, NH, HS, 500.0f);
    std::vector<float> all;
    for (const auto* v : {&out, &rstd, &dx, &dw, &h, &dgu, &q})
      all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const std::vector<float> one = run(1);
  EXPECT_EQ(run(2), one);
  EXPECT_EQ(run(3), one);
}

}  // namespace
}  // namespace keel
