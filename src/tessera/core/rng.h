// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A draw is a pure
// function of (key, counter), so any process can draw any element of any tensor without
// sharing state: the same seed gives the same initial weights and dropout masks in every
// parallel layout. The key is (seed, stream); the counter says which element.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace tessera {

// What a draw is for; part of the key so streams never overlap.
enum class RngStream : uint32_t { Init = 1, Dropout = 2, MockData = 3 };

using Philox4x32 = std::array<uint32_t, 4>;

inline Philox4x32 philox4x32(uint32_t key0, uint32_t key1, Philox4x32 ctr) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key1, static_cast<uint32_t>(p0)};
    key0 += kW0;
    key1 += kW1;
  }
  return ctr;
}

// Uniform in [0, 1) with 24 bits, from one 32-bit lane.
inline float uint_to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// Standard normal for element `index` of tensor `tensor_id`, by Box-Muller on two lanes.
inline float philox_normal(uint32_t seed, uint32_t tensor_id, uint64_t index) {
  Philox4x32 r = philox4x32(seed, static_cast<uint32_t>(RngStream::Init),
                            {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), tensor_id, 0});
  // u1 in (0, 1] so the log is finite.
  double u1 = (static_cast<double>(r[0]) + 1.0) / 4294967296.0;
  double u2 = static_cast<double>(r[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// Identifies one dropout site of one iteration: every element's keep/drop decision is a
// function of (seed, iteration, global sample, site, element index in the full tensor).
struct DropoutKey {
  uint32_t seed = 0;
  uint32_t iteration = 0;
  uint32_t site = 0;  // layer * kSitesPerLayer + which dropout in the layer
};

}  // namespace tessera
