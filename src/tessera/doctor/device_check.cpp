// The doctor's rows for the compute device --device names: what it is (name, driver,
// memory) and a kernel run through the seam (ops.h on the device against the CPU backend),
// which on OpenCL also builds the kernel programs and runs a GEMM, so a broken driver or
// compiler shows here rather than at the first training step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/device/registry.h"
#include "tessera/doctor/doctor.h"
#include "tessera/ops/ops.h"

namespace tessera::doctor {
namespace {

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// The kernel run's inputs: O(1) values from smooth functions, the same for both devices.
struct LinearGeluCase {
  static constexpr int64_t N = 16, C = 64, OC = 48;
  std::vector<float> x, w, b;
  LinearGeluCase() : x(N * C), w(OC * C), b(OC) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * std::cos(0.11f * static_cast<float>(i));
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.01f * static_cast<float>(i);
  }
};

Tensor uploaded(const Buffer& buffer, Shape shape, const std::vector<float>& values) {
  const Tensor t = tensor_at(buffer, 0, DType::F32, std::move(shape));
  copy_from_host(t, values.data(), values.size() * sizeof(float));
  return t;
}

// gelu(x @ W^T + b) on `device`, read back to the host.
std::vector<float> linear_gelu(Device& device, const LinearGeluCase& c) {
  const int64_t N = c.N, C = c.C, OC = c.OC;
  Buffer bx(device, c.x.size() * 4), bw(device, c.w.size() * 4), bb(device, c.b.size() * 4);
  Buffer blin(device, N * OC * 4), bout(device, N * OC * 4);
  const Tensor lin = tensor_at(blin, 0, DType::F32, {N, OC}), out = tensor_at(bout, 0, DType::F32, {N, OC});
  ops::linear_forward(lin, uploaded(bx, {N, C}, c.x), uploaded(bw, {OC, C}, c.w), uploaded(bb, {OC}, c.b));
  ops::gelu_forward(out, lin, ops::GeluKind::Tanh);
  std::vector<float> y(static_cast<size_t>(N * OC));
  copy_to_host(y.data(), y.size() * sizeof(float), out);
  return y;
}

Row kernel_run(Device& device) {
  Row r{"devices: " + device.name() + " kernels", Status::Pass, "", "", ""};
  const LinearGeluCase c;
  try {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<float> got = linear_gelu(device, c);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const std::vector<float> want = linear_gelu(cpu_device(), c);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    char detail[200];
    std::snprintf(detail, sizeof detail,
                  "linear + gelu (%lldx%lldx%lld) in %.0f ms (a first run: it includes loading or building the kernels); "
                  "max |device - cpu| = %.2g",
                  static_cast<long long>(c.N), static_cast<long long>(c.C), static_cast<long long>(c.OC), ms, worst);
    r.detail = detail;
    // Sums of 64 products of O(1) values: a correct device is within a few f32 ulp of 1.
    if (!(worst <= 1e-4)) {
      r.status = Status::Fail;
      r.fix = "the device computes wrong results: update its driver, or run with --device cpu";
    }
  } catch (const Error& e) {
    r.status = Status::Fail;
    r.detail = e.what();
    r.fix = e.hint().empty() ? "run with --device cpu" : e.hint();
  }
  return r;
}

}  // namespace

std::vector<Row> check_compute_device(const std::string& spec) {
  Device* device = nullptr;
  try {
    device = &open_device(spec);
  } catch (const Error& e) {
    return {{"devices: --device " + spec, Status::Fail, e.what(), e.hint(), ""}};
  }
  if (device->is_host()) return {};  // the CPU: the host rows say it all
  const MemoryInfo m = device->memory_info();
  return {{"devices: " + device->name(), Status::Pass,
           device->description() + "; " + mib(m.total_bytes) + " memory, " + mib(m.free_bytes) + " free", "", ""},
          kernel_run(*device)};
}

}  // namespace tessera::doctor
