// Buffer owns device memory (RAII, move-only): the one owner of the memory Tensors view.
// SlabBuilder lays many tensors out in one Buffer (a slab), reserved first and allocated once.
#pragma once

#include <cstddef>

#include "tessera/core/tensor.h"

namespace tessera {

class Device;

class Buffer {
 public:
  Buffer() = default;
  // Zero-filled.
  Buffer(Device& device, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* handle() const { return handle_; }
  size_t bytes() const { return bytes_; }
  Device* device() const { return device_; }

 private:
  void release();
  Device* device_ = nullptr;
  void* handle_ = nullptr;
  size_t bytes_ = 0;
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
  return Tensor(slab.handle(), offset, t, std::move(s), slab.device());
}

}  // namespace tessera
