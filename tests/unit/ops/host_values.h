// The values of a floating tensor on any device, widened to f32 on the host (exact): what the
// op tests compare. A copy to the host, so never on a training path.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/core/tensor.h"
#include "tessera/device/device.h"

namespace tessera::testing_support {

inline std::vector<float> host_values(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::F32) {
    copy_to_host(v.data(), v.size() * sizeof(float), t);
    return v;
  }
  std::vector<uint16_t> h(v.size());
  copy_to_host(h.data(), h.size() * sizeof(uint16_t), t);
  for (size_t i = 0; i < h.size(); ++i) v[i] = t.dtype == DType::BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
  return v;
}

}  // namespace tessera::testing_support
