#include "runtime/rng.h"

#include <cmath>

namespace keel::rng {

Counter philox4x32(Counter ctr, Key key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kM0) * ctr[0];
    uint64_t p1 = uint64_t(kM1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1],
           uint32_t(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

uint64_t stream(std::string_view purpose, uint64_t a, uint64_t b, uint64_t c) {
  // FNV-1a over the purpose, then mixed with the integers through one Philox block so that
  // nearby integers give unrelated streams.
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : purpose) h = (h ^ ch) * 0x100000001b3ull;
  Counter out = philox4x32({uint32_t(a), uint32_t(a >> 32), uint32_t(b), uint32_t(b >> 32)},
                           {uint32_t(h ^ c), uint32_t((h >> 32) ^ (c >> 32))});
  return (uint64_t(out[0]) << 32 | out[1]) ^ (uint64_t(out[2]) << 32 | out[3]);
}

static Counter block(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32(
      {uint32_t(index), uint32_t(index >> 32), uint32_t(stream), uint32_t(stream >> 32)},
      {uint32_t(seed), uint32_t(seed >> 32)});
}

uint64_t bits(uint64_t seed, uint64_t stream, uint64_t index) {
  Counter c = block(seed, stream, index);
  return uint64_t(c[0]) << 32 | c[1];
}

float uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return float(block(seed, stream, index)[0] >> 8) * (1.0f / 16777216.0f);
}

float normal(uint64_t seed, uint64_t stream, uint64_t index) {
  Counter c = block(seed, stream, index);
  // u1 in (0, 1] so the log is finite; computed in double so the result is exact to float.
  double u1 = (double(c[0]) + 1.0) / 4294967296.0;
  double u2 = double(c[1]) / 4294967296.0;
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace keel::rng
