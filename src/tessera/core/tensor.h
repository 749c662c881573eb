// Buffer owns device memory (RAII, move-only); Tensor is a non-owning typed view into a
// Buffer: dtype, shape, device and a pointer. One owner per buffer: models, optimizers and
// activation structs hold Buffers, everything else passes Tensors.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"
#include "tessera/core/error.h"

namespace tessera {

class Device;

class Buffer {
 public:
  Buffer() = default;
  Buffer(Device& device, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device* device() const { return device_; }

 private:
  void release();
  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

struct Tensor {
  void* ptr = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device* device = nullptr;

  Tensor() = default;
  Tensor(void* p, DType t, Shape s, Device* d) : ptr(p), dtype(t), shape(std::move(s)), device(d) {}

  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  int ndim() const { return static_cast<int>(shape.size()); }
  bool empty() const { return ptr == nullptr; }

  template <typename T> T* data() const { return static_cast<T*>(ptr); }
  float* f32() const { check_dtype(DType::F32); return static_cast<float*>(ptr); }
  int32_t* i32() const { check_dtype(DType::I32); return static_cast<int32_t*>(ptr); }

  // Same memory, another shape with the same element count.
  Tensor view(Shape s) const;
  // Rows [begin, begin+count) of the leading dimension.
  Tensor slice_rows(int64_t begin, int64_t count) const;

  void check_dtype(DType t) const {
    TESSERA_CHECK(dtype == t, "tensor has dtype " + std::string(dtype_name(dtype)) + ", expected " +
                                  std::string(dtype_name(t)));
  }
};

// Carves tensors out of one Buffer (a slab): reserve all shapes first, then allocate once.
class SlabBuilder {
 public:
  // Returns the byte offset of the reserved tensor; offsets are 64-byte aligned.
  size_t reserve(DType t, const Shape& s);
  size_t total_bytes() const { return total_; }

 private:
  size_t total_ = 0;
};

inline Tensor tensor_at(const Buffer& slab, size_t offset, DType t, Shape s) {
  return Tensor(static_cast<char*>(slab.data()) + offset, t, std::move(s), slab.device());
}

}  // namespace tessera
