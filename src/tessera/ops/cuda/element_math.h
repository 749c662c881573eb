// The per-element arithmetic of CUDA's native kernels (multi_tensor_kernels.cu,
// epilogue_kernels.cu) in C++ that nvcc (device code) and the host compiler both read, so the
// CPU tests hold it to the CPU kernels (tests/unit/ops/cuda_element_math_test.cpp): AdamW's
// update (the same bits: the files that use it compile without contraction, --fmad=false
// on CUDA, -ffp-contract=off on the host), dropout's keep factor (the same Philox bits as every
// backend's mask), GeLU's derivative, SwiGLU's value and gradients (swiglu_kernels.cu) and
// the cross-entropy's logit gradient (cross_entropy_kernels.cu), within 1e-6 relative of the
// CPU's.
#pragma once

#include <math.h>
#include <stdint.h>

#include "tessera/core/philox.h"
#include "tessera/ops/cuda/host_device.h"

namespace tessera::ops::cuda::native {

// One AdamW step on an element (optimizer.cl's adamw_element, ops/cpu/optimizer_updates.cpp),
// with the step's scalars (ops.h StepScalar) already read.
struct AdamwStep {
  float decay, gscale, w1, w1c, beta2, w2, step_size, bc2_sqrt, eps;
  int lerp_low;
  // Updates m and v; returns the new parameter.
  TESSERA_HD float operator()(float p, float& m, float& v, float g) const {
    const float gi = g * gscale;
    float pi = p * decay;
    const float mo = m;
    const float mi = lerp_low ? mo + w1 * (gi - mo) : gi - (gi - mo) * w1c;
    const float vi = v * beta2 + w2 * (gi * gi);
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    pi = pi - step_size * (mi / denom);
    m = mi;
    v = vi;
    return pi;
  }
};

// ops.h's Dropout as a kernel argument, with the elements of one sample.
struct DropoutArgs {
  float p, scale;
  uint32_t seed, site, iteration, sample0;
  uint64_t element_offset;
  int64_t per_sample;                 // the mask's element index restarts per sample
  const uint32_t* iteration_at = nullptr;  // Dropout::iteration's element, read instead of iteration
};

// The factor of element e of batch sample b: scale if kept, 0 if dropped (common.cl's
// dropout_factor, ops/cpu/dropout_mask.h).
TESSERA_HD float dropout_factor(const DropoutArgs& d, int64_t b, uint64_t e) {
  const uint64_t index = d.element_offset + e;
  tessera_philox4 ctr;
  ctr.v[0] = static_cast<uint32_t>(index / 4);
  ctr.v[1] = d.sample0 + static_cast<uint32_t>(b);
  ctr.v[2] = d.site;
  ctr.v[3] = d.iteration_at ? *d.iteration_at : d.iteration;
  const tessera_philox4 r = tessera_philox4x32(d.seed, TESSERA_RNG_STREAM_DROPOUT, ctr);
  return tessera_uint_to_unit_float(r.v[index % 4]) >= d.p ? d.scale : 0.0f;
}

// GeLU's derivative (elementwise.cl's gelu_grad) with expf / erff.
TESSERA_HD float gelu_grad(float x, bool erf) {
  if (erf) {
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
    return cdf + x * pdf;
  }
  const float k0 = 0.79788456f, k1 = 0.044715f;
  const float u = k0 * (x + k1 * x * x * x), du = k0 * (1.0f + 3.0f * k1 * x * x);
  const float s = 1.0f / (1.0f + expf(-2.0f * u));
  return s + 2.0f * x * s * (1.0f - s) * du;
}

// SwiGLU's output silu(gate) * up (elementwise.cl's swiglu_forward) with expf.
TESSERA_HD float swiglu_value(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

// SwiGLU's input gradients for one output gradient dy (elementwise.cl's swiglu_backward):
// d/dgate = dy * up * s (1 + gate (1 - s)), s = sigmoid(gate); d/dup = dy * silu(gate).
struct SwigluGrads {
  float dgate, dup;
};
TESSERA_HD SwigluGrads swiglu_grads(float gate, float up, float dy) {
  const float e = 1.0f + expf(-gate), s = 1.0f / e;
  return {dy * up * (s * (1.0f + gate * (1.0f - s))), dy * (gate / e)};
}

// The cross-entropy's gradient of one logit (cross_entropy.cl's cross_entropy_backward)
// with expf: softmax(logit) * dloss, less dloss at the target.
TESSERA_HD float cross_entropy_grad(float logit, float logsumexp, float dloss, bool target) {
  const float g = expf(logit - logsumexp) * dloss;
  return target ? g - dloss : g;
}

}  // namespace tessera::ops::cuda::native
