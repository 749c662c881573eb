// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A draw is a pure
// function of (key, counter), so any process can draw any element of any tensor without
// sharing state: the same seed gives the same initial weights and dropout masks in every
// parallel layout. The key is (seed, stream); the counter says which element. The rounds
// live in core/philox.h, shared with device code; this is its C++ face.
#pragma once

#include <array>
#include <cstdint>

#include "tessera/core/philox.h"

namespace tessera {

// What a draw is for; part of the key so streams never overlap.
enum class RngStream : uint32_t { Init = TESSERA_RNG_STREAM_INIT, Dropout = TESSERA_RNG_STREAM_DROPOUT, MockData = 3 };

using Philox4x32 = std::array<uint32_t, 4>;

inline Philox4x32 philox4x32(uint32_t key0, uint32_t key1, Philox4x32 ctr) {
  const tessera_philox4 r = tessera_philox4x32(key0, key1, {{ctr[0], ctr[1], ctr[2], ctr[3]}});
  return {r.v[0], r.v[1], r.v[2], r.v[3]};
}

// Uniform in [0, 1) with 24 bits, from one 32-bit lane.
inline float uint_to_unit_float(uint32_t x) { return tessera_uint_to_unit_float(x); }

// Standard normal for element `index` of tensor `tensor_id`, by Box-Muller on two lanes.
inline float philox_normal(uint32_t seed, uint32_t tensor_id, uint64_t index) {
  return tessera_philox_normal(seed, tensor_id, index);
}

// Identifies one dropout site of one iteration: every element's keep/drop decision is a
// function of (seed, iteration, global sample, site, element index in the full tensor).
struct DropoutKey {
  uint32_t seed = 0;
  uint32_t iteration = 0;
  uint32_t site = 0;  // layer * kSitesPerLayer + which dropout in the layer
};

}  // namespace tessera
