// OpenCL's side of ops/kernels/fp64_host.inc: the kernels of the program built with
// cl_khr_fp64, and on a device without doubles the CPU kernels on host copies.
#include <vector>

#include "tessera/ops/opencl/cl_launch.h"
#include "tessera/ops/opencl/opencl_ops.h"

namespace tessera::ops::opencl {
namespace {

ClLaunch fp64_launch(const Tensor& on, const char* kernel) { return ClLaunch::fp64(context_of(on), kernel); }

class Partials {
 public:
  Partials(const Tensor& on, size_t bytes) : scratch_(context_of(on), bytes) {}
  ClLaunch& pass(ClLaunch& launch) const { return launch.buffer(scratch_.mem()); }

 private:
  ClScratch scratch_;
};

// A host copy of t, as a tensor of the CPU device.
struct HostCopy {
  std::vector<char> bytes;
  Tensor tensor;
  explicit HostCopy(const Tensor& t) : bytes(t.bytes()) {
    if (!t.empty()) context_of(t).read(bytes.data(), cl_buffer(t), t.offset, t.bytes());
    tensor = Tensor(bytes.data(), t.dtype, t.shape, &cpu_device());
  }
  void write_back(const Tensor& t) const { context_of(t).write(cl_buffer(t), t.offset, bytes.data(), t.bytes()); }
};

template <typename Op>
bool ran_on_host(std::initializer_list<Tensor> outputs, std::initializer_list<Tensor> inputs, Op op) {
  if (context_of(*outputs.begin()).info().fp64) return false;
  std::vector<HostCopy> copies;
  copies.reserve(outputs.size() + inputs.size());
  for (const Tensor& t : outputs) copies.emplace_back(t);
  for (const Tensor& t : inputs) copies.emplace_back(t);
  std::vector<Tensor> host;
  for (const HostCopy& c : copies) host.push_back(c.tensor);
  op(host);
  size_t i = 0;
  for (const Tensor& t : outputs) copies[i++].write_back(t);
  return true;
}

bool native_multi_tensor_sum_squares(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t) {
  return false;
}

}  // namespace
}  // namespace tessera::ops::opencl

#define TESSERA_BACKEND opencl
#include "tessera/ops/kernels/fp64_host.inc"
#undef TESSERA_BACKEND
