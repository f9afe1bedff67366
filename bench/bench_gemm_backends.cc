// SGEMM backends on the medium GPT's own GEMM shapes (issue 14): OpenBLAS (any core, chosen
// with OPENBLAS_CORETYPE), oneDNN's matmul and BLIS, each run as keel's CPU backend runs
// OpenBLAS (output rows split over OpenMP threads, the library single-threaded:
// runtime/cpu/matmul.cc) and with the library's own threads; plus a 2048³ C = A·B peak, and
// a check that every result is bitwise the same on every repetition (keel's determinism
// tests demand it). Backends in one binary are interleaved call by call, so that a
// neighbour's load on a shared machine hits them alike.
//
// Not part of the CMake build: BLIS and oneDNN are not keel dependencies, and BLIS exports
// the same BLAS symbols as OpenBLAS, so BLIS is its own binary (bench/bench_gemm_backends.sh
// builds both and runs every core type):
//   I=/usr/include/x86_64-linux-gnu; F="-O2 -fopenmp bench/bench_gemm_backends.cc"
//   g++ $F -DHAVE_OPENBLAS -DHAVE_DNNL -I$I/openblas-pthread -o /tmp/gemm -lopenblas -ldnnl
//   g++ $F -DHAVE_BLIS -I$I/blis-openmp -o /tmp/gemm-blis -lblis
// Then: OPENBLAS_CORETYPE=SkylakeX /tmp/gemm [threads]   (default 2 threads)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#if defined(HAVE_OPENBLAS) && defined(HAVE_BLIS)
#error "OpenBLAS and BLIS export the same symbols: build them apart"
#endif
#ifdef HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef HAVE_BLIS
#include <blis.h>
#endif
#ifdef HAVE_DNNL
#include <dnnl.hpp>
#endif

namespace {

// One row-major GEMM: C[M,N] = op(A)·op(B), beta = 0.
struct Gemm {
  bool ta, tb;
  int M, N, K;
  const float *A, *B;
  int lda, ldb;
  float* C;
  int ldc;
};

// A library: its name, its own thread count, and one GEMM on the calling thread (or on its
// own threads).
struct Backend {
  std::string name;
  std::function<void(int)> set_threads;
  std::function<void(const Gemm&)> run;
};

#ifdef HAVE_OPENBLAS
Backend openblas() {
  return {std::string("OpenBLAS ") + openblas_get_corename(),
          [](int n) { openblas_set_num_threads(n); },
          [](const Gemm& g) {
            cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans,
                        g.tb ? CblasTrans : CblasNoTrans, g.M, g.N, g.K, 1.0f, g.A, g.lda, g.B,
                        g.ldb, 0.0f, g.C, g.ldc);
          }};
}
#endif

#ifdef HAVE_BLIS
Backend blis() {
  return {std::string("BLIS ") + bli_info_get_version_str() + " " +
              bli_arch_string(bli_arch_query_id()),
          [](int n) { bli_thread_set_num_threads(n); },
          [](const Gemm& g) {
            float one = 1.0f, zero = 0.0f;
            // Strides of the stored matrices: row-major, so row stride ld, column stride 1.
            bli_sgemm(g.ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
                      g.tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, g.M, g.N, g.K, &one,
                      const_cast<float*>(g.A), g.lda, 1, const_cast<float*>(g.B), g.ldb, 1, &zero,
                      g.C, g.ldc, 1);
          }};
}
#endif

#ifdef HAVE_DNNL
// oneDNN's matmul primitive (the API it recommends over dnnl_sgemm), one per shape and
// thread, made on first use (the warm-up). Transposes are strides of the memory descriptors.
dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
struct Prim {
  dnnl::matmul mm;
  dnnl::memory a, b, c;
};
thread_local std::vector<std::pair<std::string, std::unique_ptr<Prim>>> t_prims;
Prim& prim(const Gemm& g) {
  char key[160];
  std::snprintf(key, sizeof(key), "%d%d %d %d %d %p %p %p", g.ta, g.tb, g.M, g.N, g.K,
                static_cast<const void*>(g.A), static_cast<const void*>(g.B),
                static_cast<void*>(g.C));
  for (auto& [k, p] : t_prims)
    if (k == key) return *p;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  // op(A) is M×K: stored row-major M×K (strides lda, 1) or K×M (strides 1, lda).
  dnnl::memory::desc ad(dims{g.M, g.K}, dt::f32, g.ta ? dims{1, g.lda} : dims{g.lda, 1});
  dnnl::memory::desc bd(dims{g.K, g.N}, dt::f32, g.tb ? dims{1, g.ldb} : dims{g.ldb, 1});
  dnnl::memory::desc cd(dims{g.M, g.N}, dt::f32, dims{g.ldc, 1});
  auto p = std::make_unique<Prim>();
  p->mm = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), engine()));
  p->a = dnnl::memory(ad, engine(), const_cast<float*>(g.A));
  p->b = dnnl::memory(bd, engine(), const_cast<float*>(g.B));
  p->c = dnnl::memory(cd, engine(), g.C);
  t_prims.emplace_back(key, std::move(p));
  return *t_prims.back().second;
}
Backend onednn() {
  const dnnl_version_t* v = dnnl_version();
  return {"oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
              std::to_string(v->patch) + " matmul",
          // Its OpenMP threads; inside keel's parallel region it runs on the calling thread.
          [](int n) { omp_set_num_threads(n); },
          [](const Gemm& g) {
            Prim& p = prim(g);
            dnnl::stream s(engine());
            p.mm.execute(s, {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}});
            s.wait();
          }};
}
#endif

// keel's split (runtime/cpu/gemm): output rows in blocks of 16 over `nt` OpenMP threads, each
// a single-threaded library call.
void run_rowsplit(const Backend& b, const Gemm& g, int nt) {
  constexpr int kAlign = 16;
  const int blocks = (g.M + kAlign - 1) / kAlign;
  const int threads = std::min(nt, blocks);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    const int b0 = int(int64_t(blocks) * t / n), b1 = int(int64_t(blocks) * (t + 1) / n);
    const int r0 = b0 * kAlign, r1 = std::min(g.M, b1 * kAlign);
    if (r1 > r0) {
      Gemm part = g;
      part.M = r1 - r0;
      part.A = g.ta ? g.A + r0 : g.A + size_t(r0) * g.lda;
      part.C = g.C + size_t(r0) * g.ldc;
      b.run(part);
    }
  }
}

struct Timing {
  double best_s = 1e30;
  bool same_bits = true;
};

// Every backend runs `g` (split over `split_threads`, or on its own `nt` threads when 0):
// two warm-ups each, then 8 rounds of 3 repetitions per backend in turn, so that load from
// elsewhere hits all backends alike; the best time of each. Every repetition's output must
// equal the backend's first one bit for bit.
std::vector<Timing> time_all(const std::vector<Backend>& bs, const Gemm& g, int split_threads,
                             int nt) {
  const size_t n = size_t(g.M) * g.ldc;
  auto call = [&](const Backend& b) {
    if (split_threads > 0) {
      b.set_threads(1);
      run_rowsplit(b, g, split_threads);
    } else {
      b.set_threads(nt);
      b.run(g);
    }
  };
  std::vector<Timing> t(bs.size());
  std::vector<std::vector<float>> first(bs.size());
  for (size_t i = 0; i < bs.size(); ++i) {
    call(bs[i]);
    call(bs[i]);
    first[i].assign(g.C, g.C + n);
  }
  for (int round = 0; round < 8; ++round)
    for (size_t i = 0; i < bs.size(); ++i)
      for (int rep = 0; rep < 3; ++rep) {
        std::fill(g.C, g.C + n, -1.0f);
        const auto t0 = std::chrono::steady_clock::now();
        call(bs[i]);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        t[i].best_s = std::min(t[i].best_s, s);
        if (std::memcmp(first[i].data(), g.C, n * sizeof(float)) != 0) t[i].same_bits = false;
      }
  return t;
}

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& f : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    f = float(int64_t(x % 2001) - 1000) * 1e-3f;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const int nt = argc > 1 ? std::atoi(argv[1]) : 2;
  std::vector<Backend> bs;
#ifdef HAVE_OPENBLAS
  bs.push_back(openblas());
#endif
#ifdef HAVE_BLIS
  bs.push_back(blis());
#endif
#ifdef HAVE_DNNL
  bs.push_back(onednn());
#endif
  // The medium GPT of issue 14 (L6 d512 T256 B4, vocab 256): N = B·T tokens; per layer the
  // (C, OC) of qkv, attention projection, fc, fc projection, then the LM head.
  const int N = 1024;
  const int shapes[][2] = {{512, 1536}, {512, 512}, {512, 2048}, {2048, 512}, {512, 256}};
  const char* kinds[] = {"fwd out=inp.W^T", "bwd dinp=dout.W", "bwd dW=dout^T.inp"};
  struct Mode {
    const char* name;
    int split_threads;
  };
  const Mode modes[] = {{"rows split over threads (keel)", nt}, {"library threads", 0}};
  std::vector<bool> same(bs.size(), true);
  // flops[k] and secs[mode][backend][k]: GFLOP/s of each GEMM kind over all shapes.
  double flops[3] = {};
  std::vector<std::vector<std::vector<double>>> secs(
      2, std::vector<std::vector<double>>(bs.size(), std::vector<double>(3, 0)));
  for (const auto& s : shapes) {
    const int C = s[0], OC = s[1];
    std::vector<float> inp = random_floats(size_t(N) * C, 1), w = random_floats(size_t(OC) * C, 2);
    std::vector<float> dout = random_floats(size_t(N) * OC, 3);
    std::vector<float> out(size_t(N) * OC), dinp(size_t(N) * C), dw(size_t(OC) * C);
    const Gemm g[3] = {{false, true, N, OC, C, inp.data(), w.data(), C, C, out.data(), OC},
                       {false, false, N, C, OC, dout.data(), w.data(), OC, C, dinp.data(), C},
                       {true, false, OC, C, N, dout.data(), inp.data(), OC, C, dw.data(), C}};
    for (int k = 0; k < 3; ++k) {
      flops[k] += 2.0 * g[k].M * g[k].N * g[k].K;
      for (int m = 0; m < 2; ++m) {
        std::vector<Timing> t = time_all(bs, g[k], modes[m].split_threads, nt);
        for (size_t i = 0; i < bs.size(); ++i) {
          secs[m][i][k] += t[i].best_s;
          if (!t[i].same_bits) {
            same[i] = false;
            std::printf("NOT DETERMINISTIC: %s, %s, %s C=%d OC=%d\n", bs[i].name.c_str(),
                        modes[m].name, kinds[k], C, OC);
          }
        }
      }
    }
  }
  // The peak as keel (runtime/cpu/sgemm_peak.cc) and numpy's reference measure it.
  const int P = 2048;
  std::vector<float> a = random_floats(size_t(P) * P, 4), b = random_floats(size_t(P) * P, 5);
  std::vector<float> c(size_t(P) * P);
  const Gemm pg{false, false, P, P, P, a.data(), b.data(), P, P, c.data(), P};
  std::vector<Timing> lib = time_all(bs, pg, 0, nt), split = time_all(bs, pg, nt, nt);
  for (size_t i = 0; i < bs.size(); ++i) {
    same[i] = same[i] && lib[i].same_bits && split[i].same_bits;
    std::printf("%s, %d threads\n", bs[i].name.c_str(), nt);
    for (int m = 0; m < 2; ++m) {
      std::printf("  %-32s", modes[m].name);
      double fs = 0, ss = 0;
      for (int k = 0; k < 3; ++k) {
        std::printf(" | %s %6.1f", kinds[k], flops[k] / secs[m][i][k] / 1e9);
        fs += flops[k];
        ss += secs[m][i][k];
      }
      std::printf(" | all %6.1f GFLOP/s\n", fs / ss / 1e9);
    }
    std::printf("  2048^3 C=A.B: library threads %.1f GFLOP/s, rows split %.1f GFLOP/s\n",
                2.0 * P * P * P / lib[i].best_s / 1e9, 2.0 * P * P * P / split[i].best_s / 1e9);
    std::printf("  bitwise repeatable: %s\n", same[i] ? "yes" : "NO");
  }
  return std::all_of(same.begin(), same.end(), [](bool x) { return x; }) ? 0 : 1;
}
