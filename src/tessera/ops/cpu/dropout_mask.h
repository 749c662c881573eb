// The dropout mask of ops.h's Dropout, as per-element factors: 1/(1-p) where the element
// is kept and 0 where it is dropped. Element e of sample b is kept iff lane (off+e)%4 of
// philox4x32(seed, RngStream::Dropout, {(off+e)/4, sample0+b, site, iteration}) mapped to
// [0,1) is >= p, with off = element_offset. Forward and backward both call this, so the
// backward recomputes exactly the forward's mask and nothing is stored.
#pragma once

#include <cstdint>

#include "tessera/ops/ops.h"

namespace tessera::ops::cpu {

// factors[i] for the elements [first, first + count) of sample b (b counted within the
// batch; first counted within this shard's per-sample tensor, before element_offset).
void dropout_factors(const Dropout& dropout, int64_t b, uint64_t first, int64_t count, float* factors);

// The iteration of the Philox counter: the device scalar when present (ops.h Dropout), else
// key.iteration.
uint32_t dropout_iteration(const Dropout& dropout);

// 1 / (1 - p), checked: p must lie in [0, 1).
float dropout_scale(const Dropout& dropout);

}  // namespace tessera::ops::cpu
