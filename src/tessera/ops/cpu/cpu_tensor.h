// How the CPU kernels reach tensor memory: through the host-memory backend's accessor, so
// they run on the CPU device and on the strict test device alike.
#pragma once

#include <cstdint>

#include "tessera/device/cpu/cpu_device.h"

namespace tessera::ops::cpu {

inline float* f32(const Tensor& t) {
  t.check_dtype(DType::F32);
  return reinterpret_cast<float*>(cpu_memory(t));
}
inline int32_t* i32(const Tensor& t) {
  t.check_dtype(DType::I32);
  return reinterpret_cast<int32_t*>(cpu_memory(t));
}
// Doubles, stored as I64 (ops.h: tessera has no f64 dtype; 8-byte slots hold them).
inline double* f64(const Tensor& t) {
  t.check_dtype(DType::I64);
  return reinterpret_cast<double*>(cpu_memory(t));
}

// Whether t's device runs --deterministic-mode, where kernels keep their fixed-order paths and
// recorded bits (a tensor without a device, as tests build on host memory, runs the default).
inline bool deterministic_mode(const Tensor& t) { return t.device && t.device->deterministic_mode(); }

}  // namespace tessera::ops::cpu
