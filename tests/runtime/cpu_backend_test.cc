// The CPU backend as a whole: memory, elementwise ops, fixed-order reductions, AdamW, and
// bitwise repeatability of a small GPT block's forward and backward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/backend.h"
#include "tests/runtime/cpu_test_util.h"

namespace keel {
namespace {

using test::all_close;
using test::random_floats;

TEST(CpuBackend, DescribesItself) {
  auto be = make_cpu_backend(2);
  EXPECT_EQ(be->kind(), DeviceKind::kCpu);
  EXPECT_EQ(be->name(), "cpu (2 threads)");
  EXPECT_EQ(make_cpu_backend(1)->name(), "cpu (1 thread)");
  EXPECT_NE(make_cpu_backend(0)->name().find("cpu ("), std::string::npos);
}

// A warm standby's rehearsal: blocks freed while keeping is on come back, zeroed, to the
// next allocation of their size; small ones and other sizes get new memory.
TEST(CpuBackend, KeptBlocksServeTheNextAllocationOfTheirSize) {
  auto be = make_cpu_backend(1);
  const size_t big = size_t(3) << 20;
  be->keep_freed_blocks(true);
  auto* a = static_cast<unsigned char*>(be->alloc(big));
  auto* small = static_cast<unsigned char*>(be->alloc(4096));
  std::memset(a, 0x5a, big);
  be->free(a);
  be->free(small);
  auto* other = static_cast<unsigned char*>(be->alloc(big + 64));
  EXPECT_NE(other, a);
  auto* again = static_cast<unsigned char*>(be->alloc(big));
  EXPECT_EQ(again, a);
  for (size_t i = 0; i < big; i += 4093) ASSERT_EQ(again[i], 0) << i;
  // Off: what is held is released, and what is freed later goes back at once.
  be->free(again);
  be->keep_freed_blocks(false);
  auto* fresh = static_cast<unsigned char*>(be->alloc(big));
  for (size_t i = 0; i < big; i += 4093) ASSERT_EQ(fresh[i], 0) << i;
  be->free(fresh);
  be->free(other);
}

TEST(CpuBackend, AllocIsAlignedZeroedAndCopies) {
  auto be = make_cpu_backend(2);
  for (size_t bytes : {size_t(0), size_t(1), size_t(100), size_t(1) << 20}) {
    auto* p = static_cast<unsigned char*>(be->alloc(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(p[i], 0) << i;
    be->free(p);
  }
  be->free(nullptr);
  const auto src = random_floats(1000, 1);
  auto* a = static_cast<float*>(be->alloc(src.size() * sizeof(float)));
  auto* b = static_cast<float*>(be->alloc(src.size() * sizeof(float)));
  be->copy_from_host(a, src.data(), src.size() * sizeof(float));
  be->copy(b, a, src.size() * sizeof(float));
  std::vector<float> back(src.size());
  be->copy_to_host(back.data(), b, back.size() * sizeof(float));
  be->synchronize();
  EXPECT_EQ(back, src);
  be->free(a);
  be->free(b);
}

TEST(CpuBackend, FillAddScale) {
  auto be = make_cpu_backend(2);
  const size_t n = 100003;  // above the parallel threshold, not a multiple of anything
  auto a = random_floats(n, 2), b = random_floats(n, 3);
  std::vector<float> out(n);
  be->add(out.data(), a.data(), b.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]);
  be->add(a.data(), a.data(), b.data(), n);  // out aliasing an input
  EXPECT_EQ(a, out);
  be->scale(out.data(), n, -0.5f);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] * -0.5f);
  be->fill(out.data(), n, 2.5f);
  EXPECT_EQ(out, std::vector<float>(n, 2.5f));
  be->fill(out.data(), 3, 1.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], 2.5f);
}

TEST(CpuBackend, SumsAreAccurateAndIndependentOfThreadCount) {
  auto one = make_cpu_backend(1), two = make_cpu_backend(2);
  for (size_t n : {size_t(0), size_t(1), size_t(4095), size_t(3 * 4096 + 123), size_t(1 << 20)}) {
    SCOPED_TRACE(n);
    auto x = random_floats(n, 4);
    for (float& v : x) v += 0.25f;
    long double want = 0, want_sq = 0;
    for (float v : x) {
      want += v;
      want_sq += static_cast<long double>(v) * v;
    }
    EXPECT_EQ(one->sum(x.data(), n), two->sum(x.data(), n));
    EXPECT_EQ(one->sum_squares(x.data(), n), two->sum_squares(x.data(), n));
    EXPECT_NEAR(two->sum(x.data(), n), double(want), 1e-9 * (1 + double(want_sq)));
    EXPECT_NEAR(two->sum_squares(x.data(), n), double(want_sq), 1e-12 * (1 + double(want_sq)));
  }
}

TEST(CpuBackend, AdamWMatchesScalarReference) {
  auto be = make_cpu_backend(2);
  const size_t n = 50001;
  auto param = random_floats(n, 5);
  std::vector<float> m(n), v(n);
  std::vector<double> pr(param.begin(), param.end()), mr(n), vr(n);
  AdamWParams p;
  p.lr = 1e-2f;
  p.beta1 = 0.9f;
  p.beta2 = 0.95f;
  p.eps = 1e-8f;
  p.weight_decay = 0.1f;
  p.grad_scale = 0.5f;
  for (int64_t t = 1; t <= 3; ++t) {
    p.t = t;
    auto grad = random_floats(n, 100 + uint32_t(t));
    grad[0] = 0.0f;  // v stays 0: the eps path
    be->adamw(param.data(), grad.data(), m.data(), v.data(), n, p);
    const double b1 = p.beta1, b2 = p.beta2;
    for (size_t i = 0; i < n; ++i) {
      double g = double(grad[i]) * p.grad_scale;
      mr[i] = b1 * mr[i] + (1 - b1) * g;
      vr[i] = b2 * vr[i] + (1 - b2) * g * g;
      double mhat = mr[i] / (1 - std::pow(b1, t)), vhat = vr[i] / (1 - std::pow(b2, t));
      pr[i] -= double(p.lr) * (mhat / (std::sqrt(vhat) + p.eps) + double(p.weight_decay) * pr[i]);
    }
    SCOPED_TRACE(t);
    EXPECT_TRUE(all_close(m, mr, 1e-7, 1e-5));
    EXPECT_TRUE(all_close(v, vr, 1e-9, 1e-5));
    EXPECT_TRUE(all_close(param, pr, 1e-6, 1e-5));
  }
}

// One GPT-2 block plus head and loss, forward and backward, on `threads` threads. Returns
// every output and gradient concatenated, for a bitwise comparison between runs.
std::vector<float> gpt_block_step(int threads) {
  auto be = make_cpu_backend(threads);
  // Large enough that every matmul takes the multi-threaded path.
  const int B = 2, T = 32, C = 96, NH = 4, HS = C / NH, V = 50, Vp = 64, N = B * T;
  std::vector<int32_t> tokens(N), targets(N);
  for (int i = 0; i < N; ++i) {
    tokens[i] = (i * 13 + 5) % V;
    targets[i] = (i * 7 + 3) % V;
  }
  auto wte = random_floats(size_t(Vp) * C, 60, 0.1f), wpe = random_floats(size_t(T) * C, 61, 0.1f);
  auto ln_w = random_floats(C, 62), ln_b = random_floats(C, 63);
  auto w_qkv = random_floats(size_t(3) * C * C, 64, 0.1f), b_qkv = random_floats(3 * C, 65);
  auto w_proj = random_floats(size_t(C) * C, 66, 0.1f);
  auto w_fc = random_floats(size_t(4) * C * C, 67, 0.1f), b_fc = random_floats(4 * C, 68);
  auto w_out = random_floats(size_t(C) * 4 * C, 69, 0.1f);
  auto f = [](size_t n) { return std::vector<float>(n); };
  auto x = f(N * C), ln1 = f(N * C), mean1 = f(N), rstd1 = f(N), qkv = f(N * 3 * C),
       att = f(size_t(B) * NH * T * T), attn = f(N * C), proj = f(N * C), res = f(N * C),
       fc = f(N * 4 * C), gelu = f(N * 4 * C), mlp = f(N * C), res2 = f(N * C), logits = f(N * Vp),
       max = f(N), sum = f(N), tl = f(N), losses = f(N);
  be->embedding_forward(x.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, Vp);
  be->layernorm_forward(ln1.data(), mean1.data(), rstd1.data(), x.data(), ln_w.data(), ln_b.data(),
                        N, C);
  be->matmul_forward(qkv.data(), ln1.data(), w_qkv.data(), b_qkv.data(), N, C, 3 * C);
  be->attention_forward(attn.data(), att.data(), qkv.data(), B, T, NH, HS);
  be->matmul_forward(proj.data(), attn.data(), w_proj.data(), nullptr, N, C, C);
  be->add(res.data(), x.data(), proj.data(), N * C);
  be->matmul_forward(fc.data(), res.data(), w_fc.data(), b_fc.data(), N, C, 4 * C);
  be->gelu_forward(gelu.data(), fc.data(), N * 4 * C);
  be->matmul_forward(mlp.data(), gelu.data(), w_out.data(), nullptr, N, 4 * C, C);
  be->add(res2.data(), res.data(), mlp.data(), N * C);
  be->matmul_forward(logits.data(), res2.data(), wte.data(), nullptr, N, C, Vp);
  be->xent_row_max(max.data(), logits.data(), N, Vp, 0, V);
  be->xent_sum_exp(sum.data(), tl.data(), logits.data(), max.data(), targets.data(), N, Vp, 0, V);
  be->xent_finish(losses.data(), logits.data(), logits.data(), max.data(), sum.data(), tl.data(),
                  targets.data(), N, Vp, 0, V, 1.0f / N);

  auto dwte = f(wte.size()), dwpe = f(wpe.size()), dln_w = f(C), dln_b = f(C),
       dw_qkv = f(w_qkv.size()), db_qkv = f(3 * C), dw_proj = f(w_proj.size()),
       dw_fc = f(w_fc.size()), db_fc = f(4 * C), dw_out = f(w_out.size());
  auto dres2 = f(N * C), dgelu = f(N * 4 * C), dfc = f(N * 4 * C), dres = f(N * C),
       dattn = f(N * C), dqkv = f(N * 3 * C), scratch = f(att.size()), dln1 = f(N * C);
  be->matmul_backward(dres2.data(), dwte.data(), nullptr, logits.data(), res2.data(), wte.data(), N,
                      C, Vp);
  be->matmul_backward(dgelu.data(), dw_out.data(), nullptr, dres2.data(), gelu.data(), w_out.data(),
                      N, 4 * C, C);
  be->gelu_backward(dfc.data(), fc.data(), dgelu.data(), N * 4 * C);
  be->add(dres.data(), dres.data(), dres2.data(), N * C);
  be->matmul_backward(dres.data(), dw_fc.data(), db_fc.data(), dfc.data(), res.data(), w_fc.data(),
                      N, C, 4 * C);
  be->matmul_backward(dattn.data(), dw_proj.data(), nullptr, dres.data(), attn.data(),
                      w_proj.data(), N, C, C);
  be->attention_backward(dqkv.data(), scratch.data(), dattn.data(), qkv.data(), att.data(), B, T,
                         NH, HS);
  be->matmul_backward(dln1.data(), dw_qkv.data(), db_qkv.data(), dqkv.data(), ln1.data(),
                      w_qkv.data(), N, C, 3 * C);
  be->layernorm_backward(dres.data(), dln_w.data(), dln_b.data(), dln1.data(), x.data(),
                         ln_w.data(), mean1.data(), rstd1.data(), N, C);
  be->embedding_backward(dwte.data(), dwpe.data(), dres.data(), tokens.data(), B, T, C, 0, Vp);

  std::vector<float> all;
  for (const auto* v : {&losses, &logits, &dwte, &dwpe, &dln_w, &dln_b, &dw_qkv, &db_qkv, &dw_proj,
                        &dw_fc, &db_fc, &dw_out, &dres}) {
    all.insert(all.end(), v->begin(), v->end());
  }
  return all;
}

TEST(CpuBackend, ForwardBackwardIsBitwiseRepeatable) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    std::vector<float> first = gpt_block_step(threads), second = gpt_block_step(threads);
    ASSERT_EQ(first.size(), second.size());
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0);
    for (float v : first) ASSERT_TRUE(std::isfinite(v));
  }
  // Across thread counts only the rounding may differ.
  std::vector<float> one = gpt_block_step(1), two = gpt_block_step(2);
  EXPECT_TRUE(all_close(two, test::to_double(one), 1e-5, 1e-4));
}

}  // namespace
}  // namespace keel
