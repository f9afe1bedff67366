// The CPU backend's GPT kernels against straightforward double-precision references:
// forwards directly, backwards against central finite differences of the reference (or its
// analytic gradient for the linear layer), with gradient outputs pre-filled to check that
// they accumulate.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/cpu/kernels.h"
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

// ---- linear ---------------------------------------------------------------------------------

std::vector<double> matmul_ref(const std::vector<double>& inp, const std::vector<double>& w,
                               const std::vector<double>* bias, int N, int C, int OC) {
  std::vector<double> out(size_t(N) * OC);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double s = bias ? (*bias)[o] : 0.0;
      for (int c = 0; c < C; ++c) s += inp[size_t(n) * C + c] * w[size_t(o) * C + c];
      out[size_t(n) * OC + o] = s;
    }
  }
  return out;
}

struct MatmulShape {
  int N, C, OC, threads;
};

// How GoogleTest (and so CTest's test names) shows a shape: readable, the same every build.
std::string shape_name(const MatmulShape& s) {
  std::ostringstream o;  // (not operator+: GCC 12 warns falsely on it, -Wrestrict)
  o << "N" << s.N << "_C" << s.C << "_OC" << s.OC << "_threads" << s.threads;
  return o.str();
}
void PrintTo(const MatmulShape& s, std::ostream* os) {
  *os << shape_name(s);
}

class Matmul : public ::testing::TestWithParam<MatmulShape> {};

TEST_P(Matmul, ForwardMatchesReference) {
  const auto [N, C, OC, threads] = GetParam();
  auto be = make_cpu_backend(threads);
  auto inp = random_floats(size_t(N) * C, 1), w = random_floats(size_t(OC) * C, 2, 0.2f);
  auto bias = random_floats(OC, 3);
  std::vector<float> out(size_t(N) * OC, 123.0f);  // garbage: forward overwrites
  be->matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  auto bias_d = to_double(bias);
  EXPECT_TRUE(
      all_close(out, matmul_ref(to_double(inp), to_double(w), &bias_d, N, C, OC), 1e-5, 1e-5));
  std::fill(out.begin(), out.end(), 123.0f);
  be->matmul_forward(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
  EXPECT_TRUE(
      all_close(out, matmul_ref(to_double(inp), to_double(w), nullptr, N, C, OC), 1e-5, 1e-5));
}

TEST_P(Matmul, BackwardAccumulatesTheAnalyticGradient) {
  const auto [N, C, OC, threads] = GetParam();
  auto be = make_cpu_backend(threads);
  auto inp = random_floats(size_t(N) * C, 4), w = random_floats(size_t(OC) * C, 5, 0.2f);
  auto dout = random_floats(size_t(N) * OC, 6);
  auto dinp = random_floats(inp.size(), 7), dw = random_floats(w.size(), 8);
  auto db = random_floats(OC, 9);
  const auto dinp0 = dinp, dw0 = dw, db0 = db;
  be->matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C,
                      OC);
  std::vector<double> want_dinp(inp.size()), want_dw(w.size()), want_db(OC);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double d = dout[size_t(n) * OC + o];
      want_db[o] += d;
      for (int c = 0; c < C; ++c) {
        want_dinp[size_t(n) * C + c] += d * w[size_t(o) * C + c];
        want_dw[size_t(o) * C + c] += d * inp[size_t(n) * C + c];
      }
    }
  }
  EXPECT_TRUE(all_close(dinp, plus(dinp0, want_dinp), 1e-4, 1e-5));
  EXPECT_TRUE(all_close(dw, plus(dw0, want_dw), 1e-4, 1e-5));
  EXPECT_TRUE(all_close(db, plus(db0, want_db), 1e-4, 1e-5));
  // Without a bias gradient the others are unchanged.
  auto dinp2 = dinp0, dw2 = dw0;
  be->matmul_backward(dinp2.data(), dw2.data(), nullptr, dout.data(), inp.data(), w.data(), N, C,
                      OC);
  EXPECT_EQ(dinp2, dinp);
  EXPECT_EQ(dw2, dw);
}

// Small shapes run as one GEMM; the large ones (>= 1e6 multiply-adds) split rows over threads,
// with row counts that are not multiples of the 16-row blocks.
INSTANTIATE_TEST_SUITE_P(Shapes, Matmul,
                         ::testing::Values(MatmulShape{7, 5, 3, 2}, MatmulShape{130, 96, 100, 2},
                                           MatmulShape{130, 96, 100, 1},
                                           MatmulShape{50, 200, 131, 2}),
                         [](const auto& info) { return shape_name(info.param); });

// ---- LayerNorm ------------------------------------------------------------------------------

std::vector<double> layernorm_ref(const std::vector<double>& x, const std::vector<double>& w,
                                  const std::vector<double>& b, int N, int C,
                                  std::vector<double>* mean = nullptr,
                                  std::vector<double>* rstd = nullptr) {
  std::vector<double> out(x.size());
  for (int n = 0; n < N; ++n) {
    const double* r = x.data() + size_t(n) * C;
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += r[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (r[c] - m) * (r[c] - m);
    v /= C;
    double s = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c) out[size_t(n) * C + c] = (r[c] - m) * s * w[c] + b[c];
    if (mean) mean->push_back(m);
    if (rstd) rstd->push_back(s);
  }
  return out;
}

TEST(LayerNorm, ForwardAndBackwardMatchReference) {
  for (int C : {13, 64}) {
    SCOPED_TRACE(C);
    const int N = 3;
    auto be = make_cpu_backend(2);
    auto x = random_floats(size_t(N) * C, 10, 2.0f);
    for (float& v : x) v += 0.7f;  // a non-zero mean to remove
    auto w = random_floats(C, 11), b = random_floats(C, 12);
    std::vector<float> out(x.size(), 9.0f), mean(N), rstd(N);
    be->layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    std::vector<double> want_mean, want_rstd;
    const auto xd = to_double(x), wd = to_double(w), bd = to_double(b);
    EXPECT_TRUE(
        all_close(out, layernorm_ref(xd, wd, bd, N, C, &want_mean, &want_rstd), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(mean, want_mean, 1e-6, 1e-5));
    EXPECT_TRUE(all_close(rstd, want_rstd, 1e-6, 1e-5));

    auto dout = random_floats(x.size(), 13);
    auto dx = random_floats(x.size(), 14), dw = random_floats(C, 15), db = random_floats(C, 16);
    const auto dx0 = dx, dw0 = dw, db0 = db;
    be->layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
    const auto doutd = to_double(dout);
    auto gx =
        numeric_grad([&](const auto& v) { return layernorm_ref(v, wd, bd, N, C); }, xd, doutd);
    auto gw =
        numeric_grad([&](const auto& v) { return layernorm_ref(xd, v, bd, N, C); }, wd, doutd);
    auto gb =
        numeric_grad([&](const auto& v) { return layernorm_ref(xd, wd, v, N, C); }, bd, doutd);
    EXPECT_TRUE(all_close(dx, plus(dx0, gx), 1e-4, 1e-4));
    EXPECT_TRUE(all_close(dw, plus(dw0, gw), 1e-4, 1e-4));
    EXPECT_TRUE(all_close(db, plus(db0, gb), 1e-4, 1e-4));
  }
}

// ---- attention ------------------------------------------------------------------------------

std::vector<double> attention_ref(const std::vector<double>& qkv, int B, int T, int NH, int HS,
                                  std::vector<double>* att_out = nullptr) {
  const int C = NH * HS;
  std::vector<double> out(size_t(B) * T * C);
  if (att_out) att_out->assign(size_t(B) * NH * T * T, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const double* q = qkv.data() + (size_t(b) * T + t) * 3 * C + h * HS;
        std::vector<double> a(t + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const double* k = qkv.data() + (size_t(b) * T + j) * 3 * C + C + h * HS;
          double s = 0;
          for (int i = 0; i < HS; ++i) s += q[i] * k[i];
          a[j] = s / std::sqrt(double(HS));
          mx = std::max(mx, a[j]);
        }
        double z = 0;
        for (double& v : a) z += (v = std::exp(v - mx));
        for (int j = 0; j <= t; ++j) {
          a[j] /= z;
          if (att_out) (*att_out)[((size_t(b) * NH + h) * T + t) * T + j] = a[j];
          const double* v = qkv.data() + (size_t(b) * T + j) * 3 * C + 2 * C + h * HS;
          for (int i = 0; i < HS; ++i) out[(size_t(b) * T + t) * C + h * HS + i] += a[j] * v[i];
        }
      }
    }
  }
  return out;
}

TEST(Attention, ForwardAndBackwardMatchReference) {
  // T = 19 leaves rows whose length is not a multiple of the 8-wide vector loops.
  const int B = 2, T = 19, NH = 2, HS = 4, C = NH * HS;
  auto be = make_cpu_backend(2);
  auto qkv = random_floats(size_t(B) * T * 3 * C, 20);
  std::vector<float> out(size_t(B) * T * C, 5.0f), att(size_t(B) * NH * T * T, 5.0f);
  be->attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
  std::vector<double> want_att;
  const auto qkvd = to_double(qkv);
  EXPECT_TRUE(all_close(out, attention_ref(qkvd, B, T, NH, HS, &want_att), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(att, want_att, 1e-6, 1e-5));  // including exact zeros above the diagonal

  auto dout = random_floats(out.size(), 21);
  auto dqkv = random_floats(qkv.size(), 22);
  const auto dqkv0 = dqkv;
  std::vector<float> scratch(att.size(), 7.0f);
  be->attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, NH,
                         HS);
  auto g = numeric_grad([&](const auto& v) { return attention_ref(v, B, T, NH, HS); }, qkvd,
                        to_double(dout));
  EXPECT_TRUE(all_close(dqkv, plus(dqkv0, g), 1e-4, 1e-4));
}

// The backward of attention_ref, analytically: dqkv for a given dout.
std::vector<double> attention_backward_ref(const std::vector<double>& qkv,
                                           const std::vector<double>& dout, int B, int T, int NH,
                                           int HS) {
  const int C = NH * HS;
  std::vector<double> att, dqkv(qkv.size());
  attention_ref(qkv, B, T, NH, HS, &att);
  const double scale = 1.0 / std::sqrt(double(HS));
  auto at = [&](int b, int t, int part, int h) {
    return (size_t(b) * T + t) * 3 * C + part * C + h * HS;
  };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const double* a = att.data() + ((size_t(b) * NH + h) * T + t) * T;
        const double* d = dout.data() + (size_t(b) * T + t) * C + h * HS;
        std::vector<double> datt(t + 1);
        double dot = 0;
        for (int j = 0; j <= t; ++j) {
          for (int i = 0; i < HS; ++i) datt[j] += d[i] * qkv[at(b, j, 2, h) + i];
          dot += a[j] * datt[j];
          for (int i = 0; i < HS; ++i) dqkv[at(b, j, 2, h) + i] += a[j] * d[i];
        }
        for (int j = 0; j <= t; ++j) {
          const double dpre = a[j] * (datt[j] - dot) * scale;
          for (int i = 0; i < HS; ++i) {
            dqkv[at(b, t, 0, h) + i] += dpre * qkv[at(b, j, 1, h) + i];
            dqkv[at(b, j, 1, h) + i] += dpre * qkv[at(b, t, 0, h) + i];
          }
        }
      }
    }
  }
  return dqkv;
}

TEST(Attention, CausalBlocksMatchReferenceAtLongerSequences) {
  // T = 150 spans several of the kernel's causal row blocks, the last one partial.
  const int B = 2, T = 150, NH = 2, HS = 8, C = NH * HS;
  auto be = make_cpu_backend(2);
  auto qkv = random_floats(size_t(B) * T * 3 * C, 30);
  std::vector<float> out(size_t(B) * T * C, 5.0f), att(size_t(B) * NH * T * T, 5.0f);
  be->attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
  std::vector<double> want_att;
  const auto qkvd = to_double(qkv);
  EXPECT_TRUE(all_close(out, attention_ref(qkvd, B, T, NH, HS, &want_att), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(att, want_att, 1e-6, 1e-5));

  auto dout = random_floats(out.size(), 31);
  auto dqkv = random_floats(qkv.size(), 32);
  const auto dqkv0 = dqkv;
  std::vector<float> scratch(att.size(), 7.0f);
  be->attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, NH,
                         HS);
  EXPECT_TRUE(all_close(
      dqkv, plus(dqkv0, attention_backward_ref(qkvd, to_double(dout), B, T, NH, HS)), 1e-4, 1e-4));
}

// ---- GELU -----------------------------------------------------------------------------------

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(Gelu, ForwardAndBackwardMatchReference) {
  auto be = make_cpu_backend(2);
  std::vector<float> x = {-30.0f, -9.0f, -3.0f, -1e-3f, 0.0f, 1e-6f, 0.5f, 3.0f, 9.0f, 30.0f};
  for (int i = 0; i < 2000; ++i) x.push_back(-6.0f + 12.0f * float(i) / 1999.0f);
  const size_t n = x.size();
  std::vector<float> y(n, 3.0f);
  be->gelu_forward(y.data(), x.data(), n);
  std::vector<double> want(n), grad(n);
  for (size_t i = 0; i < n; ++i) {
    want[i] = gelu_ref(x[i]);
    const double h = 1e-5;
    grad[i] = (gelu_ref(x[i] + h) - gelu_ref(x[i] - h)) / (2 * h);
  }
  EXPECT_TRUE(all_close(y, want, 1e-6, 1e-5));
  auto dout = random_floats(n, 30), dx = random_floats(n, 31);
  const auto dx0 = dx;
  be->gelu_backward(dx.data(), x.data(), dout.data(), n);
  std::vector<double> want_dx(n);
  for (size_t i = 0; i < n; ++i) want_dx[i] = dx0[i] + grad[i] * dout[i];
  EXPECT_TRUE(all_close(dx, want_dx, 1e-5, 1e-5));
}

// ---- embedding ------------------------------------------------------------------------------

TEST(Embedding, ShardedForwardAndAccumulatingBackward) {
  const int B = 2, T = 5, C = 7, begin = 4, end = 10;
  auto be = make_cpu_backend(2);
  // Tokens outside [4, 10) belong to other TP ranks; 5 repeats.
  const std::vector<int32_t> tokens = {4, 5, 0, 9, 5, 10, 5, 3, 7, 12};
  auto wte = random_floats(size_t(end - begin) * C, 40), wpe = random_floats(size_t(T) * C, 41);
  std::vector<float> out(size_t(B) * T * C, 1.0f), out_nopos(out.size(), 1.0f);
  be->embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, begin, end);
  be->embedding_forward(out_nopos.data(), tokens.data(), wte.data(), nullptr, B, T, C, begin, end);
  std::vector<double> want(out.size()), want_nopos(out.size());
  for (int bt = 0; bt < B * T; ++bt) {
    for (int c = 0; c < C; ++c) {
      int tok = tokens[bt];
      float e = tok >= begin && tok < end ? wte[size_t(tok - begin) * C + c] : 0.0f;
      want_nopos[size_t(bt) * C + c] = e;
      want[size_t(bt) * C + c] = e + wpe[size_t(bt % T) * C + c];  // one float add: exact
    }
  }
  EXPECT_TRUE(all_close(out, want, 0, 0));
  EXPECT_TRUE(all_close(out_nopos, want_nopos, 0, 0));

  auto dout = random_floats(out.size(), 42);
  auto dwte = random_floats(wte.size(), 43), dwpe = random_floats(wpe.size(), 44);
  const auto dwte0 = dwte, dwpe0 = dwpe;
  be->embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, begin, end);
  std::vector<double> gte(wte.size()), gpe(wpe.size());
  for (int bt = 0; bt < B * T; ++bt) {
    for (int c = 0; c < C; ++c) {
      int tok = tokens[bt];
      if (tok >= begin && tok < end) gte[size_t(tok - begin) * C + c] += dout[size_t(bt) * C + c];
      gpe[size_t(bt % T) * C + c] += dout[size_t(bt) * C + c];
    }
  }
  EXPECT_TRUE(all_close(dwte, plus(dwte0, gte), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(dwpe, plus(dwpe0, gpe), 1e-6, 1e-6));
  // No position gradient requested.
  auto dwte2 = dwte0;
  be->embedding_backward(dwte2.data(), nullptr, dout.data(), tokens.data(), B, T, C, begin, end);
  EXPECT_EQ(dwte2, dwte);
}

// ---- exp ------------------------------------------------------------------------------------

TEST(ExpApprox, IsWithinAFewUlpOfExp) {
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * float(i) / 200000.0f;
    const double want = std::exp(double(x));
    worst = std::max(worst, std::abs(cpu::exp_approx(x) - want) / want);
  }
  EXPECT_LT(worst, 4e-7);  // about 3 ulp
  EXPECT_EQ(cpu::exp_approx(0.0f), 1.0f);
  EXPECT_EQ(cpu::exp_approx(-100.0f), 0.0f);
  EXPECT_EQ(cpu::exp_approx(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isfinite(cpu::exp_approx(1000.0f)));
}

}  // namespace
}  // namespace keel
