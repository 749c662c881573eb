// Main parameters: a BF16/F16 parameter is optimised through an fp32 main copy (widened at
// construction, updated by Adam, rounded into the parameter after each step, Megatron's
// Float16OptimizerWithFloat16Params), an F32 parameter in place with no copy; and the
// optimizer over pieces of a tensor (the distributed optimizer's owned ranges) gives the
// whole tensor's bits.
#include <gtest/gtest.h>

#include <vector>

#include "tessera/device/device.h"
#include "tessera/device/host_staging.h"
#include "tessera/ops/ops.h"
#include "tessera/optim/optimizer.h"

using namespace tessera;

namespace {

constexpr int64_t kN = 37;

std::vector<float> weights() {
  std::vector<float> w(kN);
  for (int64_t j = 0; j < kN; ++j) w[j] = 0.013f * static_cast<float>((j * 37) % 19) - 0.11f;
  return w;
}

std::vector<float> gradient(int step) {
  std::vector<float> g(kN);
  for (int64_t j = 0; j < kN; ++j) g[j] = 0.003f * static_cast<float>((j * 11 + 5 * step) % 23) - 0.03f;
  return g;
}

// A tensor of `dtype` on the CPU holding `values` (rounded once when 16-bit).
struct DeviceTensor {
  Buffer buffer;
  Tensor t;
  DeviceTensor(DType dtype, const std::vector<float>& values)
      : buffer(cpu_device(), values.size() * sizeof(float)), t(tensor_at(buffer, 0, dtype, {int64_t(values.size())})) {
    Buffer wide(cpu_device(), values.size() * sizeof(float));
    const Tensor f = tensor_at(wide, 0, DType::F32, t.shape);
    write_f32(f, values);
    ops::convert(t, f);
  }
  std::vector<float> values() const {
    Buffer wide(cpu_device(), t.numel() * sizeof(float));
    const Tensor f = tensor_at(wide, 0, DType::F32, t.shape);
    ops::convert(f, t);
    return read_f32(f);
  }
};

// Three Adam steps with weight decay and clipping on `param`.
void three_steps(Optimizer& opt, const Tensor& grad) {
  for (int step = 0; step < 3; ++step) {
    write_f32(grad, gradient(step));
    opt.step(1e-2, 0.1, opt.clip_coefficient(0.5));
  }
}

}  // namespace

TEST(OptimizerMainParams, SixteenBitParametersFollowTheirRoundedFp32Main) {
  for (DType dtype : {DType::BF16, DType::F16}) {
    DeviceTensor param(dtype, weights()), grad(DType::F32, gradient(0));
    // The reference: fp32 Adam from the widened 16-bit initial values.
    DeviceTensor ref(DType::F32, param.values()), ref_grad(DType::F32, gradient(0));
    Optimizer opt({}, {{param.t, grad.t, true}}, cpu_device());
    Optimizer ref_opt({}, {{ref.t, ref_grad.t, true}}, cpu_device());
    EXPECT_EQ(read_f32(opt.main_param(0)), param.values());  // widened exactly
    EXPECT_EQ(opt.state_bytes(), ref_opt.state_bytes() * 3 / 2);  // + the main copy
    three_steps(opt, grad.t);
    three_steps(ref_opt, ref_grad.t);
    const std::vector<float> main = read_f32(opt.main_param(0));
    EXPECT_EQ(main, ref.values());  // Adam ran in fp32, never on 16-bit values
    const DeviceTensor rounded(dtype, main);
    EXPECT_EQ(param.values(), rounded.values());  // the parameter is the rounded main
    EXPECT_NE(param.values(), main);               // ...which differs from it in 16 bits
    // Loaded 16-bit weights (a checkpoint) become the main values.
    const DeviceTensor loaded(dtype, gradient(7));
    copy_tensor(param.t, loaded.t);
    opt.copy_params_to_main();
    EXPECT_EQ(read_f32(opt.main_param(0)), loaded.values());
  }
}

TEST(OptimizerMainParams, Fp32ParametersAreTheirOwnMain) {
  DeviceTensor param(DType::F32, weights()), grad(DType::F32, gradient(0));
  Optimizer opt({}, {{param.t, grad.t, true}}, cpu_device());
  EXPECT_EQ(opt.main_param(0).handle, param.t.handle);
  EXPECT_EQ(opt.state_bytes(), 2 * 192u);  // two moments of 37 floats, 64-byte aligned: no copy
  three_steps(opt, grad.t);
  EXPECT_NE(param.values(), weights());
}

TEST(OptimizerMainParams, PiecesOfATensorGiveTheWholeTensorsBits) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    DeviceTensor whole(dtype, weights()), whole_grad(DType::F32, gradient(0));
    DeviceTensor split(dtype, weights()), split_grad(DType::F32, gradient(0));
    auto piece = [](const Tensor& t, int64_t begin, int64_t end) {
      return Tensor(t.handle, t.offset + begin * dtype_size(t.dtype), t.dtype, {end - begin}, t.device);
    };
    Optimizer a({}, {{whole.t, whole_grad.t, true}}, cpu_device());
    Optimizer b({}, {{piece(split.t, 0, 10), piece(split_grad.t, 0, 10), true},
                     {piece(split.t, 10, kN), piece(split_grad.t, 10, kN), true}},
                cpu_device());
    three_steps(a, whole_grad.t);
    three_steps(b, split_grad.t);
    EXPECT_EQ(split.values(), whole.values());
  }
}
