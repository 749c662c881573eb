#include "tessera/device/buffer.h"

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

size_t SlabBuilder::reserve(DType t, const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  size_t offset = total_;
  total_ += (static_cast<size_t>(n) * dtype_size(t) + 63) / 64 * 64;
  return offset;
}

}  // namespace tessera
