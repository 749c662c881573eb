#include "tessera/core/tensor.h"

#include "tessera/device/device.h"

namespace tessera {

Buffer::Buffer(Device& device, size_t bytes) : device_(&device), bytes_(bytes) {
  handle_ = device.allocate(bytes);
  if (handle_) device.fill_zero(handle_, 0, bytes);
}
Buffer::~Buffer() { release(); }
Buffer::Buffer(Buffer&& o) noexcept : device_(o.device_), handle_(o.handle_), bytes_(o.bytes_) {
  o.handle_ = nullptr;
  o.bytes_ = 0;
}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    handle_ = o.handle_;
    bytes_ = o.bytes_;
    o.handle_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}
void Buffer::release() {
  if (handle_) device_->free(handle_, bytes_);
  handle_ = nullptr;
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

void* Tensor::host_address(Where where) const {
  if (handle == nullptr) return nullptr;
  if (device != nullptr && !device->is_host())
    check_failed("device->is_host()", where.file_name(), static_cast<int>(where.line()),
                 "host access to a " + shape_str(shape) + " tensor on device " +
                     (device ? device->name() : std::string("(none)")) +
                     ", which is not host memory: copy it with copy_to_host / copy_from_host (device/device.h) "
                     "or do the work in an op");
  return static_cast<char*>(handle) + offset;
}

bool Tensor::same_memory(const Tensor& o) const {
  return device == o.device && handle == o.handle && offset == o.offset && bytes() == o.bytes();
}

Tensor Tensor::view(Shape s) const {
  Tensor t(handle, offset, dtype, std::move(s), device);
  TESSERA_CHECK(t.numel() == numel(), "view " + shape_str(t.shape) + " of " + shape_str(shape));
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t count) const {
  TESSERA_CHECK(begin >= 0 && begin + count <= shape.at(0), "slice out of range");
  Shape s = shape;
  s[0] = count;
  int64_t row = numel() / shape[0];
  return Tensor(handle, offset + static_cast<size_t>(begin * row) * dtype_size(dtype), dtype, s, device);
}

size_t SlabBuilder::reserve(DType t, const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  size_t offset = total_;
  total_ += (static_cast<size_t>(n) * dtype_size(t) + 63) / 64 * 64;
  return offset;
}

}  // namespace tessera
