#include "tessera/core/tensor.h"

#include "tessera/device/device.h"

namespace tessera {

Buffer::Buffer(Device& device, size_t bytes) : device_(&device), bytes_(bytes) {
  data_ = device.allocate(bytes);
  if (data_) device.fill_zero(data_, bytes);
}
Buffer::~Buffer() { release(); }
Buffer::Buffer(Buffer&& o) noexcept : device_(o.device_), data_(o.data_), bytes_(o.bytes_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}
void Buffer::release() {
  if (data_) device_->free(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t Tensor::numel() const { return shape_numel(shape); }

Tensor Tensor::view(Shape s) const {
  Tensor t(ptr, dtype, std::move(s), device);
  TESSERA_CHECK(t.numel() == numel(), "view " + shape_str(t.shape) + " of " + shape_str(shape));
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t count) const {
  TESSERA_CHECK(begin >= 0 && begin + count <= shape.at(0), "slice out of range");
  Shape s = shape;
  s[0] = count;
  int64_t row = numel() / shape[0];
  return Tensor(static_cast<char*>(ptr) + begin * row * dtype_size(dtype), dtype, s, device);
}

size_t SlabBuilder::reserve(DType t, const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  size_t offset = total_;
  total_ += (static_cast<size_t>(n) * dtype_size(t) + 63) / 64 * 64;
  return offset;
}

}  // namespace tessera
