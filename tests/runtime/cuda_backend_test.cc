// The CUDA backend against the CPU backend: every kernel on the same random inputs, fp32
// within float rounding, kBf16 GEMMs within bf16 rounding; plus the allocator, and run-to-run
// bitwise determinism of the sums and of the gradient reductions. Every test that needs a GPU
// skips when none is present (cuda_available()).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/check.h"
#if KEEL_HAVE_CUDA
#include "runtime/cuda/caching_allocator.h"
#endif

namespace keel {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<int32_t> randint(size_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// Every |got − want| <= atol + rtol·|want|; names the worst element otherwise.
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                 double atol, double rtol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  size_t worst = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::abs(double(got[i]) - double(want[i]));
    double excess = err - (atol + rtol * std::abs(double(want[i])));
    if (std::isnan(excess)) excess = INFINITY;
    if (excess > worst_excess) worst = i, worst_excess = excess;
  }
  if (worst_excess <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << worst << ": got " << got[worst] << ", expected " << want[worst];
}

// The same buffer on both backends, filled from one host vector.
template <typename T>
class Twin {
 public:
  Twin(Backend* cpu, Backend* gpu, const std::vector<T>& init)
      : cpu_(cpu), gpu_(gpu), n_(init.size()) {
    c_ = static_cast<T*>(cpu_->alloc(bytes()));
    g_ = static_cast<T*>(gpu_->alloc(bytes()));
    cpu_->copy_from_host(c_, init.data(), bytes());
    gpu_->copy_from_host(g_, init.data(), bytes());
  }
  Twin(Backend* cpu, Backend* gpu, size_t n) : Twin(cpu, gpu, std::vector<T>(n)) {}
  ~Twin() {
    cpu_->free(c_);
    gpu_->free(g_);
  }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;
  T* c() { return c_; }
  T* g() { return g_; }
  std::vector<T> cpu_values() const {
    std::vector<T> v(n_);
    cpu_->copy_to_host(v.data(), c_, bytes());
    return v;
  }
  std::vector<T> gpu_values() const {
    std::vector<T> v(n_);
    gpu_->copy_to_host(v.data(), g_, bytes());
    return v;
  }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  Backend* cpu_;
  Backend* gpu_;
  size_t n_;
  T* c_;
  T* g_;
};
using F = Twin<float>;
using I = Twin<int32_t>;

#define EXPECT_TWIN(t, atol, rtol) \
  EXPECT_TRUE(close((t).gpu_values(), (t).cpu_values(), atol, rtol))

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    gpu_ = make_cuda_backend(0, Precision::kFp32);
    cpu_ = make_cpu_backend(2);
  }
  Backend* c() { return cpu_.get(); }
  Backend* g() { return gpu_.get(); }
  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST(CudaBackendNoGpu, ConstructionFailsCleanlyWithoutAGpu) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  EXPECT_THROW(make_cuda_backend(0, Precision::kFp32), Error);
}

#if KEEL_HAVE_CUDA
TEST(CachingAllocator, SizeClassesBoundTheWaste) {
  using cuda::CachingAllocator;
  size_t prev = 0;
  for (size_t bytes = 1; bytes < (size_t{64} << 20); bytes = bytes * 5 / 4 + 7) {
    const size_t cls = CachingAllocator::size_class(bytes);
    ASSERT_GE(cls, bytes);
    ASSERT_GE(cls, prev);  // monotone, so a bigger request never gets a smaller block
    ASSERT_EQ(cls % 128, 0u) << bytes;
    if (bytes > 512 && bytes <= (size_t{1} << 20)) {
      ASSERT_LE(cls, bytes + bytes / 4) << bytes;
    }
    if (bytes > (size_t{1} << 20)) {
      ASSERT_LT(cls - bytes, size_t{2} << 20) << bytes;
    }
    ASSERT_EQ(CachingAllocator::size_class(cls), cls);  // a class is its own class
    prev = cls;
  }
}

TEST_F(CudaBackendTest, AllocatorReusesFreedBlocksZeroed) {
  cuda::CachingAllocator alloc(0, nullptr);
  void* a = alloc.alloc(1000);
  const auto before = alloc.stats();
  alloc.free(a);
  void* b = alloc.alloc(900);  // same size class
  EXPECT_EQ(a, b);
  EXPECT_EQ(alloc.stats().cuda_mallocs, before.cuda_mallocs);
  EXPECT_EQ(alloc.stats().cache_hits, before.cache_hits + 1);
  void* c = alloc.alloc(1 << 20);  // another class: a fresh block
  EXPECT_NE(c, b);
  EXPECT_EQ(alloc.stats().cuda_mallocs, before.cuda_mallocs + 1);
  alloc.free(b);
  alloc.free(c);
  EXPECT_EQ(alloc.stats().bytes_in_use, 0u);
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().bytes_cached, 0u);
  EXPECT_THROW(alloc.free(reinterpret_cast<void*>(0x1000)), Error);
}
#endif

TEST_F(CudaBackendTest, DescribesItselfAndRejectsBadDevices) {
  EXPECT_EQ(g()->kind(), DeviceKind::kCuda);
  EXPECT_EQ(g()->name().rfind("cuda:0 ", 0), 0u) << g()->name();
  EXPECT_THROW(make_cuda_backend(1 << 20, Precision::kFp32), Error);
}

TEST_F(CudaBackendTest, MemoryIsZeroedOnReuseAndCopies) {
  const size_t n = 1000;
  auto* p = static_cast<float*>(g()->alloc(n * sizeof(float)));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  g()->fill(p, n, 7.0f);
  g()->free(p);
  auto* q = static_cast<float*>(g()->alloc(n * sizeof(float)));
  EXPECT_EQ(p, q);  // the cached block comes back...
  std::vector<float> back(n, 1.0f);
  g()->copy_to_host(back.data(), q, n * sizeof(float));
  EXPECT_EQ(back, std::vector<float>(n, 0.0f));  // ...zero-filled
  const auto src = randn(n, 1);
  auto* r = static_cast<float*>(g()->alloc(n * sizeof(float)));
  g()->copy_from_host(q, src.data(), n * sizeof(float));
  g()->copy(r, q, n * sizeof(float));
  g()->copy_to_host(back.data(), r, n * sizeof(float));
  EXPECT_EQ(back, src);
  g()->free(q);
  g()->free(r);
  g()->free(nullptr);
  EXPECT_EQ(g()->alloc(0), nullptr);
}

TEST_F(CudaBackendTest, Elementwise) {
  const size_t n = 100003;
  F a(c(), g(), randn(n, 2)), b(c(), g(), randn(n, 3)), out(c(), g(), n);
  for (Backend* be : {c(), g()}) {
    const bool gpu = be == g();
    float *pa = gpu ? a.g() : a.c(), *pb = gpu ? b.g() : b.c(), *po = gpu ? out.g() : out.c();
    be->add(po, pa, pb, n);
    be->add(pa, pa, po, n);  // out aliasing an input
    be->scale(pb, n, -0.5f);
    be->fill(po, 17, 2.5f);
  }
  EXPECT_EQ(a.gpu_values(), a.cpu_values());
  EXPECT_EQ(b.gpu_values(), b.cpu_values());
  EXPECT_EQ(out.gpu_values(), out.cpu_values());
}

TEST_F(CudaBackendTest, SumsAreAccurateAndBitwiseRepeatable) {
  for (size_t n : {size_t(1), size_t(4095), size_t(1 << 20) + 123}) {
    SCOPED_TRACE(n);
    auto x = randn(n, 4);
    for (float& v : x) v += 0.25f;
    F t(c(), g(), x);
    double abs_sum = 0;
    for (float v : x) abs_sum += std::abs(v);
    const double s = g()->sum(t.g(), n), s2 = g()->sum_squares(t.g(), n);
    EXPECT_NEAR(s, c()->sum(t.c(), n), 1e-12 * abs_sum);
    EXPECT_NEAR(s2, c()->sum_squares(t.c(), n), 1e-12 * s2);
    for (int rep = 0; rep < 3; ++rep) {
      EXPECT_EQ(g()->sum(t.g(), n), s);
      EXPECT_EQ(g()->sum_squares(t.g(), n), s2);
    }
  }
  EXPECT_EQ(g()->sum(nullptr, 0), 0.0);
}

TEST_F(CudaBackendTest, AdamW) {
  const size_t n = 5001;
  F p(c(), g(), randn(n, 5)), grad(c(), g(), randn(n, 6)), m(c(), g(), randn(n, 7, 0.1f));
  auto vinit = randn(n, 8, 0.1f);
  for (float& x : vinit) x = x * x;
  F v(c(), g(), vinit);
  AdamWParams hp{.lr = 1e-3f, .weight_decay = 0.1f, .grad_scale = 0.5f, .t = 3};
  for (Backend* be : {c(), g()}) {
    const bool gpu = be == g();
    be->adamw(gpu ? p.g() : p.c(), gpu ? grad.g() : grad.c(), gpu ? m.g() : m.c(),
              gpu ? v.g() : v.c(), n, hp);
  }
  EXPECT_TWIN(p, 1e-6, 1e-5);
  EXPECT_TWIN(m, 1e-7, 1e-5);
  EXPECT_TWIN(v, 1e-7, 1e-5);
}

TEST_F(CudaBackendTest, EmbeddingShardForwardAndBackward) {
  const int B = 3, T = 17, C = 40, vb = 20, ve = 45, V = 60;
  const auto tokens = randint(B * T, 9, 0, V);
  I tok(c(), g(), tokens);
  F wte(c(), g(), randn((ve - vb) * C, 10)), wpe(c(), g(), randn(T * C, 11));
  F out(c(), g(), B * T * C), dout(c(), g(), randn(B * T * C, 12));
  F dwte(c(), g(), randn((ve - vb) * C, 13)), dwpe(c(), g(), randn(T * C, 14));
  for (bool with_wpe : {true, false}) {
    c()->embedding_forward(out.c(), tok.c(), wte.c(), with_wpe ? wpe.c() : nullptr, B, T, C, vb,
                           ve);
    g()->embedding_forward(out.g(), tok.g(), wte.g(), with_wpe ? wpe.g() : nullptr, B, T, C, vb,
                           ve);
    EXPECT_EQ(out.gpu_values(), out.cpu_values());
  }
  c()->embedding_backward(dwte.c(), dwpe.c(), dout.c(), tok.c(), B, T, C, vb, ve);
  g()->embedding_backward(dwte.g(), dwpe.g(), dout.g(), tok.g(), B, T, C, vb, ve);
  // Both add positions in increasing order, one at a time: the bits agree.
  EXPECT_EQ(dwte.gpu_values(), dwte.cpu_values());
  EXPECT_EQ(dwpe.gpu_values(), dwpe.cpu_values());
  g()->embedding_backward(dwte.g(), nullptr, dout.g(), tok.g(), B, T, C, vb, ve);
  c()->embedding_backward(dwte.c(), nullptr, dout.c(), tok.c(), B, T, C, vb, ve);
  EXPECT_EQ(dwte.gpu_values(), dwte.cpu_values());
}

TEST_F(CudaBackendTest, LayerNormForwardAndBackward) {
  const int N = 67, C = 97;  // neither a multiple of the warp or of the row chunk
  F inp(c(), g(), randn(N * C, 15, 2.0f)), w(c(), g(), randn(C, 16)), b(c(), g(), randn(C, 17));
  F out(c(), g(), N * C), mean(c(), g(), N), rstd(c(), g(), N);
  F dout(c(), g(), randn(N * C, 18)), dinp(c(), g(), randn(N * C, 19));
  F dw(c(), g(), randn(C, 20)), db(c(), g(), randn(C, 21));
  c()->layernorm_forward(out.c(), mean.c(), rstd.c(), inp.c(), w.c(), b.c(), N, C);
  g()->layernorm_forward(out.g(), mean.g(), rstd.g(), inp.g(), w.g(), b.g(), N, C);
  EXPECT_TWIN(out, 1e-5, 1e-5);
  EXPECT_TWIN(mean, 1e-6, 1e-5);
  EXPECT_TWIN(rstd, 1e-6, 1e-5);
  c()->layernorm_backward(dinp.c(), dw.c(), db.c(), dout.c(), inp.c(), w.c(), mean.c(), rstd.c(), N,
                          C);
  g()->layernorm_backward(dinp.g(), dw.g(), db.g(), dout.g(), inp.g(), w.g(), mean.g(), rstd.g(), N,
                          C);
  EXPECT_TWIN(dinp, 1e-4, 1e-4);
  EXPECT_TWIN(dw, 1e-4, 1e-4);
  EXPECT_TWIN(db, 1e-4, 1e-4);
  // The parameter gradients are column sums without atomics: repeating gives the same bits.
  F dw_a(c(), g(), randn(C, 50)), dw_b(c(), g(), randn(C, 50));
  for (F* t : {&dw_a, &dw_b}) {
    g()->layernorm_backward(nullptr, t->g(), nullptr, dout.g(), inp.g(), w.g(), mean.g(), rstd.g(),
                            N, C);
  }
  EXPECT_EQ(dw_a.gpu_values(), dw_b.gpu_values());
}

// out, dinp, dweight, dbias of one linear layer on `gpu` vs the CPU backend.
void check_matmul(Backend* cpu, Backend* gpu, bool with_bias, double atol, double rtol) {
  const int N = 70, C = 96, OC = 130;
  F inp(cpu, gpu, randn(N * C, 22)), w(cpu, gpu, randn(OC * C, 23, 0.2f)),
      b(cpu, gpu, randn(OC, 24));
  F out(cpu, gpu, N * OC), dout(cpu, gpu, randn(N * OC, 25));
  F dinp(cpu, gpu, randn(N * C, 26)), dw(cpu, gpu, randn(OC * C, 27)), db(cpu, gpu, randn(OC, 28));
  for (Backend* be : {cpu, gpu}) {
    const bool g = be == gpu;
    be->matmul_forward(g ? out.g() : out.c(), g ? inp.g() : inp.c(), g ? w.g() : w.c(),
                       with_bias ? (g ? b.g() : b.c()) : nullptr, N, C, OC);
    be->matmul_backward(g ? dinp.g() : dinp.c(), g ? dw.g() : dw.c(),
                        with_bias ? (g ? db.g() : db.c()) : nullptr, g ? dout.g() : dout.c(),
                        g ? inp.g() : inp.c(), g ? w.g() : w.c(), N, C, OC);
  }
  EXPECT_TWIN(out, atol, rtol);
  EXPECT_TWIN(dinp, atol, rtol);
  EXPECT_TWIN(dw, atol, rtol);
  EXPECT_TWIN(db, 1e-4, 1e-4);  // bias gradient is an fp32 column sum in both precisions
  if (atol > 1e-3) {
    // A bf16 run must really round its operands: the products differ from true fp32 ones.
    EXPECT_FALSE(close(out.gpu_values(), out.cpu_values(), 0, 0));
  }
}

TEST_F(CudaBackendTest, MatmulFp32) {
  check_matmul(c(), g(), true, 1e-4, 1e-4);
  check_matmul(c(), g(), false, 1e-4, 1e-4);
}

TEST_F(CudaBackendTest, MatmulBf16) {
  auto bf16 = make_cuda_backend(0, Precision::kBf16);
  // Operands rounded to 8 bits of mantissa, sums of 96..130 products accumulated in fp32.
  check_matmul(c(), bf16.get(), true, 0.1, 0.02);
}

void check_attention(Backend* cpu, Backend* gpu, double atol, double rtol) {
  const int B = 2, T = 37, NH = 3, HS = 16, C = NH * HS;
  F qkv(cpu, gpu, randn(B * T * 3 * C, 29)), out(cpu, gpu, B * T * C);
  F att(cpu, gpu, randn(B * NH * T * T, 30));  // garbage in: forward must overwrite all of it
  F dout(cpu, gpu, randn(B * T * C, 31)), dqkv(cpu, gpu, randn(B * T * 3 * C, 32));
  F scratch(cpu, gpu, B * NH * T * T);
  cpu->attention_forward(out.c(), att.c(), qkv.c(), B, T, NH, HS);
  gpu->attention_forward(out.g(), att.g(), qkv.g(), B, T, NH, HS);
  EXPECT_TWIN(att, atol, rtol);
  EXPECT_TWIN(out, atol, rtol);
  cpu->attention_backward(dqkv.c(), scratch.c(), dout.c(), qkv.c(), att.c(), B, T, NH, HS);
  gpu->attention_backward(dqkv.g(), scratch.g(), dout.g(), qkv.g(), att.g(), B, T, NH, HS);
  EXPECT_TWIN(dqkv, atol, rtol);
}

TEST_F(CudaBackendTest, AttentionFp32) {
  check_attention(c(), g(), 1e-5, 1e-4);
}

TEST_F(CudaBackendTest, AttentionBf16) {
  auto bf16 = make_cuda_backend(0, Precision::kBf16);
  check_attention(c(), bf16.get(), 0.05, 0.03);
}

TEST_F(CudaBackendTest, Gelu) {
  const size_t n = 10007;
  F inp(c(), g(), randn(n, 33, 2.0f)), out(c(), g(), n);
  F dout(c(), g(), randn(n, 34)), dinp(c(), g(), randn(n, 35));
  c()->gelu_forward(out.c(), inp.c(), n);
  g()->gelu_forward(out.g(), inp.g(), n);
  c()->gelu_backward(dinp.c(), inp.c(), dout.c(), n);
  g()->gelu_backward(dinp.g(), inp.g(), dout.g(), n);
  EXPECT_TWIN(out, 1e-6, 1e-5);
  EXPECT_TWIN(dinp, 1e-5, 1e-5);
}

TEST_F(CudaBackendTest, CrossEntropyShardWithPadding) {
  // Second of two vocab shards: columns [70, 140), of which [120, 140) are padding.
  const int N = 13, V_local = 70, vb = 70, V = 120;
  auto targets = randint(N, 36, 0, V);
  targets[0] = vb;  // at least one local target, and one on the first local column
  I tgt(c(), g(), targets);
  auto logits_init = randn(N * V_local, 37, 3.0f);
  F logits(c(), g(), logits_init), row_max(c(), g(), N), sum_exp(c(), g(), N);
  F target_logit(c(), g(), N), losses(c(), g(), N), dlogits(c(), g(), randn(N * V_local, 38));
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place);
    for (Backend* be : {c(), g()}) {
      const bool gp = be == g();
      float* lg = gp ? logits.g() : logits.c();
      be->copy_from_host(lg, logits_init.data(), logits_init.size() * sizeof(float));
      float* dl = in_place ? lg : (gp ? dlogits.g() : dlogits.c());
      be->xent_row_max(gp ? row_max.g() : row_max.c(), lg, N, V_local, vb, V);
      be->xent_sum_exp(gp ? sum_exp.g() : sum_exp.c(), gp ? target_logit.g() : target_logit.c(), lg,
                       gp ? row_max.g() : row_max.c(), gp ? tgt.g() : tgt.c(), N, V_local, vb, V);
      be->xent_finish(gp ? losses.g() : losses.c(), dl, lg, gp ? row_max.g() : row_max.c(),
                      gp ? sum_exp.g() : sum_exp.c(), gp ? target_logit.g() : target_logit.c(),
                      gp ? tgt.g() : tgt.c(), N, V_local, vb, V, 0.25f);
    }
    EXPECT_EQ(row_max.gpu_values(), row_max.cpu_values());
    EXPECT_TWIN(sum_exp, 1e-5, 1e-5);
    EXPECT_EQ(target_logit.gpu_values(), target_logit.cpu_values());
    EXPECT_TWIN(losses, 1e-5, 1e-5);
    if (in_place) {
      EXPECT_TWIN(logits, 1e-6, 1e-5);
    } else {
      EXPECT_TWIN(dlogits, 1e-6, 1e-5);
    }
  }
  // losses only (no gradient)
  c()->xent_finish(losses.c(), nullptr, logits.c(), row_max.c(), sum_exp.c(), target_logit.c(),
                   tgt.c(), N, V_local, vb, V, 1.0f);
  g()->xent_finish(losses.g(), nullptr, logits.g(), row_max.g(), sum_exp.g(), target_logit.g(),
                   tgt.g(), N, V_local, vb, V, 1.0f);
  EXPECT_TWIN(losses, 1e-5, 1e-5);
}

TEST_F(CudaBackendTest, MatmulBiasGradientIsBitwiseRepeatable) {
  const int N = 300, C = 8, OC = 77;
  F dout(c(), g(), randn(N * OC, 39)), inp(c(), g(), randn(N * C, 40)),
      w(c(), g(), randn(OC * C, 41));
  F db1(c(), g(), OC), db2(c(), g(), OC), dw1(c(), g(), OC * C), dw2(c(), g(), OC * C);
  g()->matmul_backward(nullptr, dw1.g(), db1.g(), dout.g(), inp.g(), w.g(), N, C, OC);
  g()->matmul_backward(nullptr, dw2.g(), db2.g(), dout.g(), inp.g(), w.g(), N, C, OC);
  EXPECT_EQ(db1.gpu_values(), db2.gpu_values());
  EXPECT_EQ(dw1.gpu_values(), dw2.gpu_values());
}

}  // namespace
}  // namespace keel
