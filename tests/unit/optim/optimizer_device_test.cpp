// The optimizer on the strict device (host memory that refuses host access): Adam and SGD
// keep their state in device slabs and update through ops only, so three steps there
// give the CPU's bits, and a stray host access would throw naming the place.
#include <gtest/gtest.h>

#include <vector>

#include "tessera/device/cpu/cpu_device.h"
#include "tessera/device/device.h"
#include "tessera/device/host_staging.h"
#include "tessera/optim/optimizer.h"

using namespace tessera;

namespace {

// Three steps of `kind` on two parameters; the weights and the state, read back.
std::vector<std::vector<float>> three_steps(Device& device, OptimizerKind kind) {
  const Shape shapes[2] = {{7, 5}, {11}};
  std::vector<Buffer> buffers;
  std::vector<OptimizerParam> params;
  for (int i = 0; i < 2; ++i) {
    const int64_t n = shape_numel(shapes[i]);
    std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      w[j] = 0.01f * static_cast<float>((j * 37 + i) % 19) - 0.09f;
      g[j] = 0.003f * static_cast<float>((j * 11 + 3 * i) % 23) - 0.03f;
    }
    buffers.emplace_back(device, static_cast<size_t>(n) * sizeof(float));
    const Tensor param = tensor_at(buffers.back(), 0, DType::F32, shapes[i]);
    buffers.emplace_back(device, static_cast<size_t>(n) * sizeof(float));
    const Tensor grad = tensor_at(buffers.back(), 0, DType::F32, shapes[i]);
    write_f32(param, w);
    write_f32(grad, g);
    params.push_back({param, grad, i == 0});
  }
  OptimizerConfig config;
  config.kind = kind;
  Optimizer opt(config, params, device);
  for (int step = 0; step < 3; ++step) opt.step(1e-2, 0.1, opt.clip_coefficient(2.5));
  std::vector<std::vector<float>> out;
  for (const OptimizerParam& p : opt.params()) out.push_back(read_f32(p.param));
  for (const Optimizer::StateTensor& s : opt.state_tensors()) out.push_back(read_f32(s.tensor));
  return out;
}

}  // namespace

TEST(OptimizerOnDevice, AdamOnStrictEqualsCpu) {
  EXPECT_EQ(three_steps(cpu_device(), OptimizerKind::Adam), three_steps(strict_device(), OptimizerKind::Adam));
}

TEST(OptimizerOnDevice, SgdOnStrictEqualsCpu) {
  EXPECT_EQ(three_steps(cpu_device(), OptimizerKind::SGD), three_steps(strict_device(), OptimizerKind::SGD));
}
