// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11). A draw is a pure
// function of (seed, stream, index): no generator state exists, so a draw never depends on
// how many draws came before it, on thread timing, or on how a tensor is sharded. keel keys
// every random choice by (seed, step, rank, purpose) through `stream`.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace keel::rng {

using Counter = std::array<uint32_t, 4>;
using Key = std::array<uint32_t, 2>;

// One Philox-4x32-10 block: four 32-bit outputs for a 128-bit counter and a 64-bit key.
Counter philox4x32(Counter counter, Key key);

// A 64-bit stream id for a purpose string and up to three integers (e.g. step, rank).
uint64_t stream(std::string_view purpose, uint64_t a = 0, uint64_t b = 0, uint64_t c = 0);

// 64 random bits for element `index` of stream `stream` under `seed`.
uint64_t bits(uint64_t seed, uint64_t stream, uint64_t index);
// Uniform in [0, 1), 24 bits of resolution.
float uniform(uint64_t seed, uint64_t stream, uint64_t index);
// Standard normal (Box-Muller on one Philox block).
float normal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace keel::rng
