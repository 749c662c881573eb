// The host side of kernels/dtype.cl, shared by the OpenCL and CUDA launchers: the dtype
// codes the kernels read, and the checks each op runs on its tensors' dtypes before
// launching (ops.h: floating tensors may be F32, BF16 or F16 unless the op keeps one in
// F32), whose errors name the op, the argument and the dtype, as the CPU backend's do.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "tessera/core/tensor.h"

namespace tessera::ops {

static_assert(static_cast<int>(DType::F32) == 0 && static_cast<int>(DType::BF16) == 1 &&
                  static_cast<int>(DType::F16) == 2,
              "kernels/dtype.cl's DT_F32, DT_BF16, DT_F16 are DType's values");

inline bool is_floating(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// The code of a floating tensor for the kernels (0 for an absent one).
inline int32_t float_code(const Tensor& t) { return t.empty() ? 0 : static_cast<int32_t>(t.dtype); }

struct Arg {
  const char* name;
  const Tensor& tensor;
};

// Throws a runtime Error naming the op, the argument and its dtype unless every present
// tensor of `args` is F32, BF16 or F16 (the messages of ops/cpu/storage.h's checks).
inline void check_floating(const char* op, std::initializer_list<Arg> args) {
  for (const Arg& a : args)
    if (!a.tensor.empty() && !is_floating(a.tensor.dtype))
      throw runtime_error(std::string(op) + ": " + a.name + " has dtype " + std::string(dtype_name(a.tensor.dtype)) +
                              "; it must be f32, bf16 or f16",
                          "pass a floating tensor (ops.h lists each op's arguments)");
}

// The same for the arguments ops.h keeps F32 (statistics, optimizer state).
inline void check_f32(const char* op, std::initializer_list<Arg> args) {
  for (const Arg& a : args)
    if (!a.tensor.empty() && a.tensor.dtype != DType::F32)
      throw runtime_error(std::string(op) + ": " + a.name + " has dtype " + std::string(dtype_name(a.tensor.dtype)) +
                              "; it must be f32",
                          "ops.h keeps this argument in fp32 (statistics, optimizer state): allocate it as f32");
}

}  // namespace tessera::ops
