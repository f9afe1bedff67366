#include "robust/self_check.h"

#include <cmath>
#include <vector>

#include "parallel/socket_communicator.h"
#include "runtime/check.h"
#include "runtime/rng.h"

namespace keel {

SelfCheckResult gemm_self_check(Backend& backend, Precision precision) {
  constexpr int N = 64, C = 96, OC = 80;
  std::vector<float> x(size_t(N) * C), w(size_t(OC) * C), b(OC), out(size_t(N) * OC);
  const uint64_t stream = rng::stream("self-check/gemm");
  for (size_t i = 0; i < x.size(); ++i) x[i] = rng::normal(7, stream, i);
  for (size_t i = 0; i < w.size(); ++i) w[i] = rng::normal(7, stream, x.size() + i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = rng::normal(7, stream, x.size() + w.size() + i);
  auto dev = [&](const std::vector<float>& h) {
    float* p = static_cast<float*>(backend.alloc(h.size() * sizeof(float)));
    backend.copy_from_host(p, h.data(), h.size() * sizeof(float));
    return p;
  };
  float *dx = dev(x), *dw = dev(w), *db = dev(b), *dout = dev(out);
  backend.matmul_forward(dout, dx, dw, db, N, C, OC);
  backend.copy_to_host(out.data(), dout, out.size() * sizeof(float));
  for (float* p : {dx, dw, db, dout}) backend.free(p);
  // Each product and partial sum rounds once: |error| <= C·u·Σ|x·w| (u: unit roundoff of
  // the precision computed in), measured relative to Σ|x·w| so that the bound is C·u.
  const double u = precision == Precision::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24);
  SelfCheckResult r;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double ref = b[size_t(o)], mag = std::abs(b[size_t(o)]);
      for (int c = 0; c < C; ++c) {
        const double p = double(x[size_t(n) * C + c]) * w[size_t(o) * C + c];
        ref += p;
        mag += std::abs(p);
      }
      const double err = std::abs(double(out[size_t(n) * OC + o]) - ref) / mag;
      if (!(err <= r.max_rel_error)) r.max_rel_error = std::isnan(err) ? INFINITY : err;
    }
  r.ok = r.max_rel_error <= 2.0 * C * u;
  r.message = detail::concat("GEMM ", N, "x", C, "x", OC, ": max relative error ", r.max_rel_error,
                             r.ok ? " (within " : " (beyond ", 2.0 * C * u, ")");
  return r;
}

SelfCheckResult collective_self_check(std::shared_ptr<Store> store, const std::string& name,
                                      int rank, int size, const std::string& host,
                                      std::chrono::milliseconds timeout, bool break_links) {
  SelfCheckResult r;
  if (size <= 1) {
    r.ok = true;
    r.message = "all-reduce: alone, nothing to check";
    return r;
  }
  try {
    SocketCommOptions o;
    o.name = name;
    o.rank = rank;
    o.size = size;
    o.timeout = timeout;
    o.host = host;
    auto comm = make_socket_communicator(std::move(store), o);
    if (break_links) comm->abort();  // a machine whose network is defective (fault link_error)
    float v[4] = {float(rank + 1), float(rank + 1), float(rank + 1), float(rank + 1)};
    comm->all_reduce(v, 4);
    const float want = float(size) * float(size + 1) / 2;
    r.ok = v[0] == want && v[3] == want;
    r.message = detail::concat("all-reduce over ", size, " standby worker(s): ", v[0],
                               r.ok ? " as expected" : detail::concat(", expected ", want));
  } catch (const std::exception& e) {
    r.message = std::string("all-reduce among the standbys failed: ") + e.what();
  }
  return r;
}

}  // namespace keel
