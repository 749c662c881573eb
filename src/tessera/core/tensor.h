// Tensor: a non-owning typed view of device memory (dtype, shape, device and the memory as
// (handle, byte offset)). The memory belongs to a Buffer (device/buffer.h): models,
// optimizers and activation structs hold Buffers, everything else passes Tensors.
//
// A handle is opaque outside its backend (a cl_mem on OpenCL): views and slices move the
// offset, never the handle. host<T>() / f32() / i32() give the address for host code and
// abort unless the device is host-addressable (Device::is_host); kernels reach their
// memory through their backend's own accessor instead. A tensor without a device is plain
// host memory (the control scalars that go through the host group).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <source_location>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/core/error.h"

namespace tessera {

class Device;

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

struct Tensor {
  void* handle = nullptr;
  size_t offset = 0;  // bytes from the start of handle's memory
  DType dtype = DType::F32;
  Shape shape;
  Device* device = nullptr;

  Tensor() = default;
  Tensor(void* h, size_t off, DType t, Shape s, Device* d)
      : handle(h), offset(off), dtype(t), shape(std::move(s)), device(d) {}
  // Host memory as a tensor of the CPU device (the handle is the address).
  Tensor(void* host, DType t, Shape s, Device* d) : Tensor(host, 0, t, std::move(s), d) {}

  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  int ndim() const { return static_cast<int>(shape.size()); }
  bool empty() const { return handle == nullptr; }

  // Host address of the first element. Aborts naming the caller's file:line and the device
  // unless the device is host memory.
  using Where = std::source_location;
  template <typename T> T* host(Where where = Where::current()) const {
    return static_cast<T*>(host_address(where));
  }
  // (host_address is defined in device/device.cpp: whether memory is host memory is the
  // device's to say.)
  float* f32(Where where = Where::current()) const { check_dtype(DType::F32); return host<float>(where); }
  int32_t* i32(Where where = Where::current()) const { check_dtype(DType::I32); return host<int32_t>(where); }

  // Same memory, another shape with the same element count.
  Tensor view(Shape s) const;
  // Rows [begin, begin+count) of the leading dimension.
  Tensor slice_rows(int64_t begin, int64_t count) const;
  // The same memory range (same device, handle, offset and byte size).
  bool same_memory(const Tensor& o) const;

  void check_dtype(DType t) const {
    TESSERA_CHECK(dtype == t, "tensor has dtype " + std::string(dtype_name(dtype)) + ", expected " +
                                  std::string(dtype_name(t)));
  }

 private:
  void* host_address(Where where) const;
};

}  // namespace tessera
