// ops.h's Dropout as the kernels' DROPOUT_PARAMS (kernels/common.cl), in the order the kernels
// declare them, pushed onto either launcher (OpenCL's ClLaunch, CUDA's CudaLaunch): p,
// 1/(1-p), seed, site, iteration, the device iteration scalar (absent: none), sample0,
// element_offset.
#pragma once

#include <cstdint>

#include "tessera/ops/ops.h"

namespace tessera::ops {

template <typename Launch>
Launch& push_dropout_params(Launch& launch, const Dropout& d) {
  const float scale = d.p > 0.0f ? 1.0f / (1.0f - d.p) : 1.0f;
  return launch.template scalar<float>(d.p)
      .template scalar<float>(scale)
      .template scalar<uint32_t>(d.key.seed)
      .template scalar<uint32_t>(d.key.site)
      .template scalar<uint32_t>(d.key.iteration)
      .tensor(d.iteration)
      .template scalar<uint32_t>(d.sample0)
      .template scalar<uint64_t>(d.element_offset);
}

}  // namespace tessera::ops
